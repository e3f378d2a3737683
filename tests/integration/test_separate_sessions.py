"""Cluster configurations the shared fixtures cannot have: fake GPUs, dynamic allocation.

Each starts its own Spark application in a subprocess (one SparkContext at a time per
process): the CPU ones one after the other in one subprocess (one Python, one JVM), each
test reading its own application's result.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.stacks import needs_gpu

ROOT = Path(__file__).resolve().parents[2]
# the modes the CPU tests read, run by one subprocess: ~25 s, ~25 s, ~5 s and ~10 s on 2 cores
SHARED_MODES = ("gpu", "gpu_profile", "dynamic", "daemon")
SHARED_TIMEOUT_S = 420


def run_probes(*modes: str, timeout: float = 240) -> dict:
    """Each mode's result (its application's own, in one subprocess); a mode that raised
    has its traceback under ``probe_error``."""
    proc = subprocess.run([sys.executable, "-m", "tests.integration.separate_sessions", *modes],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)})
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            mode, _, text = line[len("RESULT "):].partition(" ")
            results[mode] = json.loads(text)
    results["_failed"] = f"(rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    return results


def result(results: dict, mode: str) -> dict:
    assert mode in results, f"probe {mode} printed no result {results['_failed']}"
    out = results[mode]
    assert "probe_error" not in out, f"probe {mode} failed:\n{out.get('probe_error')}"
    return out


@pytest.fixture(scope="module")
def shared():
    """The CPU modes' results, from one subprocess started by the first test that asks."""
    return run_probes(*SHARED_MODES, timeout=SHARED_TIMEOUT_S)


def run_probe(mode: str) -> dict:
    return result(run_probes(mode), mode)


@pytest.mark.timeout(SHARED_TIMEOUT_S + 60)  # the first test pays for the shared subprocess
def test_gpu_scheduling_path_with_fake_gpus(shared):
    out = result(shared, "gpu")
    ranks = sorted(out["ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    visible = ["5", "7"]  # spark.executorEnv.CUDA_VISIBLE_DEVICES on the executors
    for r in ranks:
        assert len(r["assigned"]) == 1 and r["use_gpu"] == "1"
        # Spark's address is an index into the executor's pre-set CUDA_VISIBLE_DEVICES
        assert r["cvd"] == visible[int(r["assigned"][0])]
    # restored for plain tasks afterwards
    assert out["after"] == ["5,7", "5,7"]
    # the CUDA path itself fails clearly on a CPU build instead of hanging
    assert "NCCL backend needs CUDA" in out["nccl_error"]


@pytest.mark.timeout(SHARED_TIMEOUT_S + 60)
def test_only_the_training_stage_asks_for_gpus(shared):
    """Stage-level scheduling with fake GPUs: 1 executor, 4 cores, 2 GPUs, no task GPU
    amount. Other jobs run as CPU tasks (4 at once, no GPU held); each rank gets a GPU of
    its own and the executor's cores / GPUs as its CPUs and torch threads; a third rank is
    refused at once, naming GPUs as the limit."""
    out = result(shared, "gpu_profile")
    assert out["cpu_slots"] == 4 and out["gpu_slots"] == 2
    assert out["etl_resources"] == [[], [], [], []]
    ranks = out["ranks"]
    assert sorted(r["assigned"][0] for r in ranks) == ["0", "1"]
    for r in ranks:
        assert r["assigned"] == [r["cvd"]]
        assert r["task_cpus"] == 2 and r["torch_threads"] == 2
    assert out["too_many"] and "GPUs, not cores, are the limit" in out["too_many"]
    assert "can run 2 GPU rank(s)" in out["too_many"]
    # every executor is there: no waiting for more (the wait is 30 s)
    assert out["too_many_s"] < 20
    assert any("1 GPU and 2 CPU(s) per rank" in line and "CPU tasks" in line
               for line in out["gpu_lines"]), out["gpu_lines"]


@needs_gpu
@pytest.mark.timeout(600)
def test_on_a_real_gpu_nccl_placement_and_a_fit():
    """Where CUDA is: one rank per GPU joins an NCCL group with its tensors on its own
    device, and TorchEstimator(useGpu=True) trains digits on a GPU executor."""
    out = run_probe("real_gpu")
    gpus = out["gpus"]
    assert out["nccl"]["backend"] == "cpu:gloo,cuda:nccl"
    assert out["nccl"]["device"].startswith("cuda")
    assert out["nccl"]["sum"] == gpus * (gpus + 1) / 2
    assert out["history"] == 15 and out["accuracy"] >= 0.9


@pytest.mark.timeout(SHARED_TIMEOUT_S + 60)
def test_dynamic_allocation_is_refused_before_launch(shared):
    out = result(shared, "dynamic")
    assert out["error"] and "spark.dynamicAllocation.enabled=false" in out["error"]
    assert out["jobs"] == 0  # refused from the conf alone: no Spark job ran first


@pytest.mark.timeout(SHARED_TIMEOUT_S + 60)
def test_a_worker_daemon_that_preloads_torch(shared):
    out = result(shared, "daemon")
    # the application's very first Python workers: pyspark's own daemon has not imported
    # torch in them
    assert out["preloaded"] == [True, True], out
    assert out["run"] == "0", out
