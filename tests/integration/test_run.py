"""sparkddl.run on real Spark: local[2] and local-cluster[2,1,1024]."""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import sparkddl
from sparkddl import ClusterError, ConfigError, TrainingFailedError

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


def allreduce_sum(value: float) -> float:
    import torch.distributed as dist
    sparkddl.init_process_group()
    t = torch.tensor([value * (dist.get_rank() + 1)])
    dist.all_reduce(t)
    return float(t.item())


def torchrun_style_step() -> dict:
    """Written as for torchrun: reads the environment, initializes the group itself."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert int(os.environ["LOCAL_RANK"]) < int(os.environ["LOCAL_WORLD_SIZE"])
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _shard(rank)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    weights = [p.detach().clone() for p in model.parameters()]
    gathered = [torch.zeros_like(weights[0]) for _ in range(world)]
    dist.all_gather(gathered, weights[0])
    return {"world": world, "weights": weights, "same_on_all_ranks":
            all(torch.equal(g, gathered[0]) for g in gathered)}


def _shard(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)


def expected_single_process_step() -> list[torch.Tensor]:
    """The same step on one process with the gradient averaged over both shards."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = [torch.nn.functional.mse_loss(model(x), y) for x, y in map(_shard, range(2))]
    (sum(losses) / 2).backward()
    opt.step()
    return [p.detach() for p in model.parameters()]


def fail_on_rank_one() -> None:
    import torch.distributed as dist
    sparkddl.init_process_group(timeout_s=1800)
    if dist.get_rank() == 1:
        raise ValueError("rank one broke on purpose")
    dist.all_reduce(torch.ones(1))  # rank 0 blocks here until the stage is cancelled


def torchrun_env() -> dict:
    return {k: os.environ.get(k) for k in TORCHRUN_VARS}


def worker_state() -> dict:
    """What a task sees of the Python worker it runs in."""
    import logging
    return {"pid": os.getpid(), "env": torchrun_env(), "threads": torch.get_num_threads(),
            "rng": torch.get_rng_state().sum().item(), "stdout": type(sys.stdout).__name__,
            "handlers": len(logging.getLogger().handlers)}


def disturb_worker() -> dict:
    """A run that changes everything it can in its worker: seeds, threads, logging."""
    import logging
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO)
    return torchrun_env()


@pytest.mark.timeout(120)
def test_allreduce_sums_over_ranks(spark):
    assert sparkddl.run(allreduce_sum, 1.5, num_workers=2, spark=spark) == pytest.approx(4.5)


@pytest.mark.timeout(120)
def test_unmodified_torchrun_function_trains_ddp(spark):
    out = sparkddl.run(torchrun_style_step, num_workers=2, spark=spark)
    assert out["world"] == 2 and out["same_on_all_ranks"]
    for got, want in zip(out["weights"], expected_single_process_step()):
        torch.testing.assert_close(got, want)


@pytest.mark.timeout(240)
def test_ten_back_to_back_runs(spark):
    results = [sparkddl.run(allreduce_sum, float(i), num_workers=2, spark=spark)
               for i in range(10)]
    assert results == [3.0 * i for i in range(10)]


@pytest.mark.timeout(90)
def test_failing_rank_surfaces_with_its_traceback(spark):
    # rank 0 waits in an allreduce with a 30-minute timeout; only cancellation frees it
    started = time.monotonic()
    with pytest.raises(TrainingFailedError) as info:
        sparkddl.run(fail_on_rank_one, num_workers=2, spark=spark)
    # not a speed figure: without the report the error would come when the collective
    # times out (30 min) - "within seconds" is the behaviour under test
    assert time.monotonic() - started < 30
    err = info.value
    assert 1 in err.ranks
    first = err.failures[0]
    assert first.rank == 1 and "rank one broke on purpose" in first.message
    assert "fail_on_rank_one" in first.traceback and "ValueError" in first.traceback
    # the session is still usable and the environment was restored
    assert sparkddl.run(allreduce_sum, 1.0, num_workers=2, spark=spark) == 3.0


@pytest.mark.timeout(120)
def test_environment_restored_after_run(spark):
    sc = spark.sparkContext
    before = sc.parallelize(range(2), 2).map(lambda _: worker_state()).collect()
    seen = sparkddl.run(disturb_worker, num_workers=2, spark=spark)
    assert seen["WORLD_SIZE"] == "2" and seen["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    # plain tasks afterwards run in the same reused Python workers and must see none of it
    after = sc.parallelize(range(2), 2).map(lambda _: worker_state()).collect()
    assert {s["pid"] for s in after} == {s["pid"] for s in before}  # the same workers
    by_pid = {s["pid"]: s for s in before}
    for state in after:
        assert all(v is None for v in state["env"].values())
        assert state == by_pid[state["pid"]]  # threads, RNG, stdout and logging as before


def print_then_wait(marker: str) -> str:
    """Rank 0 prints, then waits until the driver has shown that line (it creates marker)."""
    import time
    if int(os.environ["RANK"]) == 0:
        print("x" * 200_000 + " end-of-long-line")
        print("ping from rank zero", flush=True)
        deadline = time.time() + 60
        while not os.path.exists(marker):
            if time.time() > deadline:
                raise TimeoutError("the driver never showed the line while the job ran")
            time.sleep(0.05)
    return "ok"


class _Watcher:
    """Stands in for the driver's sys.stdout; creates the marker when the ping arrives."""

    def __init__(self, marker: Path, real):
        self.marker, self.real, self.lines = marker, real, []

    def write(self, text: str) -> int:
        self.lines.append(text)
        if "[rank 0] ping from rank zero" in text:
            self.marker.touch()
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.timeout(120)
def test_rank_output_reaches_driver_while_running(spark, tmp_path, monkeypatch):
    marker = tmp_path / "seen"
    watcher = _Watcher(marker, sys.stdout)
    monkeypatch.setattr(sys, "stdout", watcher)
    assert sparkddl.run(print_then_wait, str(marker), num_workers=2, spark=spark) == "ok"
    long_lines = [ln for ln in watcher.lines if ln.endswith(" end-of-long-line\n")]
    assert long_lines == ["[rank 0] " + "x" * 200_000 + " end-of-long-line\n"]


def rank_logs() -> int:
    import logging
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("user.code").info("logged by rank %s", os.environ["RANK"])
    return 0


@pytest.mark.timeout(120)
def test_logging_output_reaches_driver(spark_local, capsys):
    sparkddl.run(rank_logs, num_workers=2, spark=spark_local)
    err = capsys.readouterr().err
    assert "[rank 0] INFO:user.code:logged by rank 0" in err
    assert "[rank 1] INFO:user.code:logged by rank 1" in err


# ---- preflight: clear errors on the driver, nothing launched ----

def test_too_many_workers_is_refused(spark_local):
    with pytest.raises(ClusterError,
                       match=r"num_workers=3 but the cluster has 2 task slots in all"):
        sparkddl.run(allreduce_sum, 1.0, num_workers=3, spark=spark_local)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_num_workers(spark_local, bad):
    with pytest.raises(ConfigError, match="num_workers must be a positive integer"):
        sparkddl.run(allreduce_sum, 1.0, num_workers=bad, spark=spark_local)


def test_use_gpu_without_gpu_resources(spark):
    """Local masters need task GPU resources; on a cluster the executors need GPUs (the
    training stage asks for them itself)."""
    match = ("use_gpu=True but no GPU task resources" if spark.sparkContext.master.startswith(
        "local[") else r"use_gpu=True but the executors of local-cluster\S* have no GPUs")
    with pytest.raises(ClusterError, match=match):
        sparkddl.run(allreduce_sum, 1.0, num_workers=2, use_gpu=True, spark=spark)


def test_unpicklable_closure_is_named(spark):
    lock = threading.Lock()

    def uses_lock() -> None:
        with lock:
            pass

    with pytest.raises(ConfigError, match=r"variable 'lock' that .*uses_lock closes over "
                                          r"\(lock\) cannot be pickled"):
        sparkddl.run(uses_lock, num_workers=2, spark=spark)


def test_closing_over_the_session_is_named(spark):
    session = spark

    def uses_session() -> int:
        return session.range(3).count()

    with pytest.raises(ConfigError, match=r"variable 'session'.*\(SparkSession\)"):
        sparkddl.run(uses_session, num_workers=2, spark=spark)


def test_default_num_workers_uses_every_slot(spark):
    def world() -> str:
        return os.environ["WORLD_SIZE"]
    assert sparkddl.run(world, spark=spark) == "2"


def raise_huge() -> None:
    raise ValueError("x" * 3_000_000)


@pytest.mark.timeout(60)
def test_a_huge_failure_report_still_reaches_the_driver(spark_local):
    with pytest.raises(TrainingFailedError) as info:
        sparkddl.run(raise_huge, num_workers=2, spark=spark_local)
    messages = [f.message for f in info.value.failures]
    assert any("ValueError: xxx" in m and "characters cut" in m for m in messages)
    assert all(len(m) < 100_000 for m in messages)


@pytest.mark.timeout(60)
def test_timeout_cancels_a_stuck_run(spark_local):
    def stuck() -> None:
        import time
        time.sleep(600)

    with pytest.raises(TrainingFailedError, match=r"timed out after 5s"):
        sparkddl.run(stuck, num_workers=2, timeout=5, spark=spark_local)


def post_two_epochs() -> None:
    """Sends two rows and returns at once: the stage ends while the driver may still be
    handling the first."""
    from sparkddl.channel import messages
    from sparkddl.task import context

    for epoch in (1, 2):
        context.current().channel.post(messages.Epoch(row={"epoch": epoch}))


@pytest.mark.timeout(120)
def test_every_frame_a_rank_sent_is_handled_before_the_stage_returns(spark_local):
    """A large last snapshot was still being read when Spark reported the tasks done, and
    closing the channel then dropped it (the last epoch went unevaluated)."""
    from sparkddl.channel import messages
    from sparkddl.launch.launcher import launch_ranks

    seen = []

    def slow(msg, body):
        if body.row["epoch"] == 1:
            time.sleep(2)  # as reading and handling a big frame would take
        seen.append((msg.rank, body.row["epoch"]))

    from sparkddl.launch.stage import DRAIN_S
    started = time.monotonic()
    launch_ranks(spark_local.sparkContext, post_two_epochs, num_workers=2, run_id="drain",
                 description="drain test", timeout_s=90, handlers={messages.Epoch: slow})
    assert sorted(seen) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert time.monotonic() - started < DRAIN_S / 2  # it waited for the frames, not the limit
