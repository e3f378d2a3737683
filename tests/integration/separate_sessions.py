"""Checks that need a Spark session configured differently from the shared fixtures.

Run as ``python -m tests.integration.separate_sessions gpu|dynamic``; prints one JSON line.
The tests in test_separate_sessions.py start it in a subprocess with a timeout.
"""
from __future__ import annotations

import json
import os
import sys
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


def gpu_main() -> dict:
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
             .config("spark.ui.enabled", "false")
             .config("spark.worker.resource.gpu.amount", "2")
             .config("spark.worker.resource.gpu.discoveryScript", str(SCRIPT))
             .config("spark.executor.resource.gpu.amount", "1")
             .config("spark.task.resource.gpu.amount", "1")
             .config("spark.executorEnv.CUDA_VISIBLE_DEVICES", "5,7")
             .getOrCreate())
    out = sparkddl.run(gpu_env, num_workers=2, use_gpu=True, spark=spark, timeout=120)
    out["after"] = spark.sparkContext.parallelize(range(2), 2).map(plain_env).collect()
    try:
        sparkddl.run(needs_nccl, num_workers=2, use_gpu=True, spark=spark, timeout=120)
        out["nccl_error"] = None
    except sparkddl.TrainingFailedError as exc:
        out["nccl_error"] = exc.failures[0].message if exc.failures else str(exc)
    spark.stop()
    return out


def dynamic_main() -> dict:
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local-cluster[1,1,1024]")
             .config("spark.ui.enabled", "false")
             .config("spark.dynamicAllocation.enabled", "true")
             .config("spark.dynamicAllocation.shuffleTracking.enabled", "true")
             .getOrCreate())
    try:
        sparkddl.run(plain_env, None, num_workers=1, spark=spark)
        return {"error": None}
    except sparkddl.ClusterError as exc:
        return {"error": str(exc)}
    finally:
        spark.stop()


if __name__ == "__main__":
    result = {"gpu": gpu_main, "dynamic": dynamic_main}[sys.argv[1]]()
    print("RESULT " + json.dumps(result), flush=True)
