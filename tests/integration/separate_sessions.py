"""Checks that need a Spark session configured differently from the shared fixtures.

Run as ``python -m tests.integration.separate_sessions MODE [MODE...]`` (modes: gpu,
gpu_profile, real_gpu, dynamic); prints one ``RESULT <mode> <json>`` line per mode. The modes
run one after the other in the one process (one JVM), each in a Spark application of its own,
stopped before the next starts. The tests in test_separate_sessions.py start it in a
subprocess with a timeout.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import sparkddl

SCRIPT = Path(__file__).parent / "scripts" / "fake_gpus.sh"


def gpu_env() -> dict:
    import torch.distributed as dist
    sparkddl.init_process_group("gloo")  # NCCL needs a real GPU; the scheduling path does not
    from pyspark import TaskContext
    mine = {"rank": dist.get_rank(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "assigned": list(TaskContext.get().resources()["gpu"].addresses),
            "use_gpu": os.environ.get("SPARKDDL_USE_GPU")}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {"ranks": everyone}


def needs_nccl() -> None:
    sparkddl.init_process_group()


def plain_env(_):
    return os.environ.get("CUDA_VISIBLE_DEVICES")


# every conf key a mode below sets: a session must have none of them that it did not set
PROBE_KEYS = ("spark.worker.resource.gpu.amount", "spark.worker.resource.gpu.discoveryScript",
              "spark.executor.resource.gpu.amount",
              "spark.executor.resource.gpu.discoveryScript", "spark.task.resource.gpu.amount",
              "spark.executorEnv.CUDA_VISIBLE_DEVICES", "spark.dynamicAllocation.enabled",
              "spark.dynamicAllocation.shuffleTracking.enabled", "spark.python.daemon.module")


def session(master: str, conf: dict):
    """A new Spark application on ``master`` with exactly ``conf`` of PROBE_KEYS (an earlier
    mode's application in this process must be stopped, and none of its conf may leak in:
    pyspark passes the first application's conf to the JVM it launches, as defaults for
    every later one, hence the bare JVM that main() starts first)."""
    from pyspark.sql import SparkSession
    if SparkSession.getActiveSession() is not None:
        raise RuntimeError("an earlier mode's Spark application is still running")
    builder = SparkSession.builder.master(master).config("spark.ui.enabled", "false")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    have = dict(spark.sparkContext.getConf().getAll())
    wrong = {k: have.get(k) for k in PROBE_KEYS if have.get(k) != conf.get(k)}
    if wrong:
        spark.stop()
        raise RuntimeError(f"the {master} session does not have the conf it was built with: "
                           f"{wrong}")
    return spark


def gpu_main() -> dict:
    spark = session("local-cluster[2,1,1024]", {
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": str(SCRIPT),
        "spark.executor.resource.gpu.amount": "1",
        "spark.task.resource.gpu.amount": "1",
        "spark.executorEnv.CUDA_VISIBLE_DEVICES": "5,7"})
    out = sparkddl.run(gpu_env, num_workers=2, use_gpu=True, spark=spark, timeout=120)
    out["after"] = spark.sparkContext.parallelize(range(2), 2).map(plain_env).collect()
    try:
        sparkddl.run(needs_nccl, num_workers=2, use_gpu=True, spark=spark, timeout=120)
        out["nccl_error"] = None
    except sparkddl.TrainingFailedError as exc:
        out["nccl_error"] = exc.failures[0].message if exc.failures else str(exc)
    spark.stop()
    return out


def profile_env() -> dict:
    import torch
    from pyspark import TaskContext
    ctx = TaskContext.get()
    return {"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "task_cpus": ctx.cpus(),
            "assigned": list(ctx.resources()["gpu"].addresses),
            "torch_threads": torch.get_num_threads()}


def gather_profile_env() -> list:
    import torch.distributed as dist
    sparkddl.init_process_group("gloo")
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, profile_env())
    return everyone


def etl_task(_):
    from pyspark import TaskContext
    return sorted(TaskContext.get().resources())


def gpu_profile_main() -> dict:
    """Executors with GPUs, tasks without (spark.task.resource.gpu.amount unset): the
    training stage alone asks for them, through a stage-level resource profile."""
    import logging
    import time

    spark = session("local-cluster[1,4,2048]", {
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": str(SCRIPT),
        "spark.executor.resource.gpu.amount": "2",
        "spark.executor.resource.gpu.discoveryScript": str(SCRIPT)})
    lines: list = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("sparkddl").addHandler(handler)
    logging.getLogger("sparkddl").setLevel(logging.INFO)
    sc = spark.sparkContext
    from sparkddl.launch import preflight
    # a job first: the executor has registered once it has run (slots are counted then)
    out: dict = {"etl_resources": sc.parallelize(range(4), 4).map(etl_task).collect()}
    out.update(cpu_slots=preflight.task_slots(sc),
               ranks=sparkddl.run(gather_profile_env, num_workers=2, use_gpu=True,
                                  spark=spark, timeout=120))
    out["gpu_slots"] = preflight.task_slots(sc, preflight.stage_profile(sc, True))
    started = time.monotonic()
    try:
        sparkddl.run(profile_env, num_workers=3, use_gpu=True, spark=spark, timeout=120)
        out["too_many"] = None
    except sparkddl.ClusterError as exc:
        out["too_many"] = str(exc)
    out["too_many_s"] = time.monotonic() - started
    out["gpu_lines"] = [line for line in lines if line.startswith("GPU:")]
    spark.stop()
    return out


def nccl_allreduce() -> dict:
    import torch
    import torch.distributed as dist
    backend = sparkddl.init_process_group()
    t = torch.full((1,), float(dist.get_rank() + 1), device=sparkddl.device())
    dist.all_reduce(t)
    return {"backend": backend, "device": str(t.device), "sum": t.item(),
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}


def real_gpu_main() -> dict:
    """A real GPU (the machine has CUDA): the NCCL group, device placement and a
    TorchEstimator(useGpu=True) fit on local-cluster, GPUs found by a discovery script."""
    import tempfile

    import torch
    from pyspark.sql import SparkSession

    from sparkddl import TorchEstimator
    from sparkddl.task.gpu import write_discovery_script
    from tests.integration.digits import accuracy, digits_df, mlp

    gpus = torch.cuda.device_count()
    tmp = Path(tempfile.mkdtemp(prefix="sparkddl-gpu-"))
    script = write_discovery_script(tmp / "discover.sh")
    cores = max(2, min(os.cpu_count() or 2, 8))
    spark = (SparkSession.builder.master(f"local-cluster[1,{cores},4096]")
             .config("spark.ui.enabled", "false")
             .config("spark.worker.resource.gpu.amount", str(gpus))
             .config("spark.worker.resource.gpu.discoveryScript", str(script))
             .config("spark.executor.resource.gpu.amount", str(gpus))
             .config("spark.executor.resource.gpu.discoveryScript", str(script))
             .getOrCreate())
    out: dict = {"gpus": gpus, "nccl": sparkddl.run(nccl_allreduce, num_workers=gpus,
                                                   use_gpu=True, spark=spark, timeout=300)}
    df = digits_df(spark)
    train, test = df.filter("split != 0"), df.filter("split = 0")
    est = TorchEstimator(model=mlp(), optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                         loss=torch.nn.CrossEntropyLoss(), featuresCol="features",
                         labelCol="label", batchSize=32, epochs=15, numWorkers=1,
                         validation=0.2, store=str(tmp / "store"), progress=False,
                         useGpu=True)
    model = est.fit(train)
    out["history"] = len(model.history)
    out["accuracy"] = accuracy(model.transform(test))
    spark.stop()
    return out


def dynamic_main() -> dict:
    spark = session("local-cluster[1,1,1024]", {
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true"})
    try:
        sparkddl.run(plain_env, None, num_workers=1, spark=spark)
        return {"error": None}
    except sparkddl.ClusterError as exc:
        # the Spark jobs run before the refusal (none: not even the executors' Python check)
        return {"error": str(exc),
                "jobs": len(spark.sparkContext.statusTracker().getJobIdsForGroup())}
    finally:
        spark.stop()


def preloaded(_):
    """Whether torch was imported before this task's code ran (its worker's doing)."""
    import sys
    yield "torch" in sys.modules


def trivial_rank() -> str:
    import os
    return os.environ["RANK"]


def daemon_main() -> dict:
    """``spark.python.daemon.module=sparkddl.task.daemon``: the application's first Python
    workers start with torch imported, and a run works on them."""
    spark = session("local[2]", {"spark.python.daemon.module": "sparkddl.task.daemon"})
    try:
        first = spark.sparkContext.parallelize(range(2), 2).mapPartitions(preloaded).collect()
        return {"preloaded": first,
                "run": sparkddl.run(trivial_rank, num_workers=2, spark=spark)}
    finally:
        spark.stop()


MODES = {"daemon": daemon_main, "gpu": gpu_main, "gpu_profile": gpu_profile_main,
         "real_gpu": real_gpu_main, "dynamic": dynamic_main}


def main(modes: list) -> None:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    SparkContext._ensure_initialized()  # the JVM, launched with no mode's conf
    for mode in modes:
        try:
            result = MODES[mode]()
        except Exception:  # noqa: BLE001 - that mode's test shows it; the next modes run
            result = {"probe_error": traceback.format_exc()}
        finally:
            left = SparkSession.getActiveSession()
            if left is not None:  # a mode that failed before its own stop()
                left.stop()
        print(f"RESULT {mode} " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
