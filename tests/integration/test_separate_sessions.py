"""Cluster configurations the shared fixtures cannot have: fake GPUs, dynamic allocation.

Each starts its own Spark application in a subprocess (one SparkContext per process).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_probe(mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.integration.separate_sessions", mode],
                          cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"probe {mode} printed no result (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.timeout(300)
def test_gpu_scheduling_path_with_fake_gpus():
    out = run_probe("gpu")
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


@pytest.mark.timeout(300)
def test_dynamic_allocation_is_refused_before_launch():
    out = run_probe("dynamic")
    assert out["error"] and "spark.dynamicAllocation.enabled=false" in out["error"]
