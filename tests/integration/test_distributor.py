"""``sparkddl.TorchDistributor``: pyspark's TorchDistributor tests that apply to a drop-in
(python/pyspark/ml/torch/tests/test_distributor.py in Apache Spark), ported, plus the
behaviour those tests stub out (the processes really run here). Differences: see README."""
from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from sparkddl import ClusterError, TorchDistributor, TrainingFailedError

TORCHRUN_KEYS = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                 "SPARKDDL_LOCAL_RANK", "SPARKDDL_LOCAL_WORLD_SIZE")


def allreduce_rank_sum(scale: float) -> dict:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([scale * (dist.get_rank() + 1)])
    dist.all_reduce(t)
    env = {k: os.environ.get(k) for k in TORCHRUN_KEYS}
    env["run_id"] = bool(os.environ.get("TORCHELASTIC_RUN_ID"))
    every: list = [None, None]
    dist.all_gather_object(every, env)
    return {"sum": t.item(), "rank": dist.get_rank(), "world": dist.get_world_size(),
            "env": every, "ppid": os.getppid()}


def echo_keywords(**kwargs) -> dict:
    """A user function whose keywords share names with sparkddl.run's own options."""
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    return kwargs


def fails_on_rank_1() -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("rank 1 cannot train")
    dist.barrier()  # rank 0 waits here for a peer that is gone


@pytest.fixture
def conf(spark_local):
    """Set Spark conf keys for one test, restoring them after (the session is shared)."""
    sc_conf = spark_local.sparkContext._conf
    saved = {}

    def set_(key, value):
        saved.setdefault(key, sc_conf.get(key, None))
        sc_conf.set(key, value)

    yield set_
    for key, value in saved.items():
        if value is None:  # SparkConf has no remove: its JVM side does
            sc_conf._jconf.remove(key)
        else:
            sc_conf.set(key, value)


@pytest.mark.parametrize("num_processes, local_mode, use_gpu", [
    (1, True, False), (100, True, False), (1, False, False), (100, False, False)])
def test_validate_correct_inputs(spark_local, num_processes, local_mode, use_gpu):
    dist = TorchDistributor(num_processes, local_mode, use_gpu)
    assert dist.input_params == {"num_processes": num_processes, "local_mode": local_mode,
                                 "use_gpu": use_gpu, "num_tasks": num_processes}


def test_validate_incorrect_inputs(spark_local):
    with pytest.raises(ValueError, match="positive"):
        TorchDistributor(0, False, False)


@pytest.mark.parametrize("ssl, ignore", [("false", "true"), ("false", "false"),
                                         ("true", "true")])
def test_encryption_passes(spark_local, conf, ssl, ignore):
    conf("spark.ssl.enabled", ssl)
    conf("pytorch.spark.distributor.ignoreSsl", ignore)
    TorchDistributor(1, True, False)._check_encryption()


def test_encryption_fails(spark_local, conf):
    conf("spark.ssl.enabled", "true")
    conf("pytorch.spark.distributor.ignoreSsl", "false")
    with pytest.raises(RuntimeError, match="encrypted"):
        TorchDistributor(1, True, False)


@pytest.mark.parametrize("num_processes", [1, 5, 4])
def test_get_num_tasks_fails_without_gpus(spark_local, num_processes):
    with pytest.raises(RuntimeError, match="driver"):
        TorchDistributor(num_processes, True, True)
    with pytest.raises(RuntimeError, match="unset"):
        TorchDistributor(num_processes, False, True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("local_mode", [True, False])
def test_a_function_trains_on_every_process_and_rank_0_answers(spark_local, local_mode):
    got = TorchDistributor(2, local_mode, False).run(allreduce_rank_sum, 1.5)
    assert got["sum"] == pytest.approx(1.5 + 3.0) and (got["rank"], got["world"]) == (0, 2)
    # pyspark's environment: local mode, one torchrun node of 2 processes; distributed,
    # every task a node of one process (so LOCAL_RANK-based set_device finds its only GPU),
    # the host-local values under sparkddl's own names (both ranks on this host)
    for rank, env in enumerate(got["env"]):
        local = (str(rank), "2", "0", "0") if local_mode else ("0", "1", str(rank), str(rank))
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"],
                env["NODE_RANK"]) == local
        assert (env["SPARKDDL_LOCAL_RANK"], env["SPARKDDL_LOCAL_WORLD_SIZE"]) == (str(rank), "2")
        assert env["run_id"]
    # local mode: the driver started the processes; else they are Spark's Python workers
    assert (got["ppid"] == os.getpid()) == local_mode


@pytest.mark.timeout(300)
@pytest.mark.parametrize("local_mode", [True, False])
def test_a_script_runs_with_its_arguments_and_returns_none(spark_local, tmp_path, local_mode):
    out = tmp_path / "out"
    out.mkdir()
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent('''
        import sys, os
        import torch.distributed as dist
        dist.init_process_group("gloo")
        with open(os.path.join(sys.argv[2], f"rank{dist.get_rank()}"), "w") as f:
            f.write(" ".join(sys.argv[1:]))
        '''))
    assert TorchDistributor(2, local_mode, False).run(str(path), 7, str(out)) is None
    assert sorted(p.name for p in out.iterdir()) == ["rank0", "rank1"]
    assert (out / "rank1").read_text() == f"7 {out}"  # numbers given as arguments: strings


@pytest.mark.timeout(300)
@pytest.mark.parametrize("local_mode", [True, False])
def test_a_failing_process_fails_the_run_at_once_naming_it(spark_local, local_mode):
    started = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        TorchDistributor(2, local_mode, False).run(fails_on_rank_1)
    assert info.value.failures[0].rank == 1
    assert "ValueError: rank 1 cannot train" in str(info.value)
    assert "raise ValueError" in info.value.failures[0].traceback
    assert time.monotonic() - started < 60  # not the barrier's 30-minute timeout
    assert not _local_ranks_alive()  # rank 0, blocked in its barrier, was killed


def _local_ranks_alive() -> list[int]:
    """This process's children that are local-mode ranks."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"sparkddl.launch.local" in cmdline:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.timeout(300)
@pytest.mark.parametrize("local_mode", [True, False])
def test_every_keyword_goes_to_the_function(spark_local, local_mode):
    """pyspark passes run(fn, **kwargs) on whole: keywords named like sparkddl.run's own
    options (timeout, spark, num_workers, use_gpu, torch_threads) are the function's."""
    kwargs = {"timeout": 30, "spark": "mine", "num_workers": 7, "use_gpu": "yes",
              "torch_threads": 3, "lr": 0.1}
    assert TorchDistributor(2, local_mode, False).run(echo_keywords, **kwargs) == kwargs


@pytest.mark.timeout(300)
def test_a_failed_run_is_a_runtime_error_as_pyspark_raises(spark_local):
    try:
        TorchDistributor(2, False, False).run(fails_on_rank_1)
    except RuntimeError as exc:  # what callers of pyspark's distributor catch
        assert isinstance(exc, TrainingFailedError)
    else:
        raise AssertionError("the run did not fail")


def test_ignore_ssl_set_on_the_session_is_honoured(spark_local, conf):
    conf("spark.ssl.enabled", "true")
    spark_local.conf.set("pytorch.spark.distributor.ignoreSsl", "true")
    try:
        TorchDistributor(1, True, False)._check_encryption()  # no error
    finally:
        spark_local.conf.unset("pytorch.spark.distributor.ignoreSsl")
    with pytest.raises(RuntimeError, match="encrypted"):
        TorchDistributor(1, True, False)


def test_ssl_enabled_on_the_session_is_refused_as_pyspark_refuses_it(spark_local):
    """pyspark reads spark.ssl.enabled through the session: set there, it refuses too."""
    spark_local.conf.set("spark.ssl.enabled", "true")
    try:
        with pytest.raises(RuntimeError, match="encrypted"):
            TorchDistributor(1, True, False)
    finally:
        spark_local.conf.unset("spark.ssl.enabled")
    TorchDistributor(1, True, False)  # unset again: no error


def test_errors_speak_of_num_processes(spark_local):
    with pytest.raises(ClusterError, match=r"num_processes=64 .*lower num_processes") as info:
        TorchDistributor(64, False, False).run(echo_keywords)
    assert "num_workers" not in str(info.value)


GPUS_CHILD = '''
import json, logging, os, sys
from pyspark.sql import SparkSession
from sparkddl import TorchDistributor

def visible():
    return os.environ["CUDA_VISIBLE_DEVICES"]

logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
spark = (SparkSession.builder.master("local[2]")
         .config("spark.driver.resource.gpu.amount", "3")
         .config("spark.driver.resource.gpu.discoveryScript", sys.argv[1])
         .config("spark.ui.enabled", "false").getOrCreate())
cut = TorchDistributor(4, True, True)
fits = TorchDistributor(2, True, True)
print("RESULT", json.dumps({"cut": [cut.num_processes, cut.input_params["num_tasks"]],
                            "fits": fits.num_processes, "sees": cut.run(visible)}))
'''


@pytest.mark.timeout(180)
def test_local_mode_counts_the_gpus_spark_gave_the_driver_as_pyspark_does(tmp_path):
    """pyspark counts local mode's GPUs from spark.driver.resource.gpu.*, cuts num_processes
    to them with a warning, and has the processes see those GPUs (addresses index into
    CUDA_VISIBLE_DEVICES where it is set). No GPU is needed: the processes only read it."""
    import subprocess
    import sys
    script = tmp_path / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1", "2"]}\'\n')
    script.chmod(0o755)
    child = tmp_path / "child.py"
    child.write_text(GPUS_CHILD)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "5,6,7,8"}
    done = subprocess.run([sys.executable, str(child), str(script)], env=env, timeout=150,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    assert json.loads(got.split(" ", 1)[1]) == {"cut": [3, 3], "fits": 2, "sees": "5,6,7"}
    assert "num_processes=4 is more than the 3 GPUs on the driver" in done.stdout
