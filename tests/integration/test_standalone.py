"""spark-submit jobs/train.py to a real standalone master + worker on 127.0.0.1."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkddl.standalone import StandaloneCluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(420)
def test_spark_submit_to_a_standalone_cluster(tmp_path):
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    cluster = StandaloneCluster(cores=2, memory="2g")
    with cluster:
        proc = subprocess.run(
            [str(submit), "--master", cluster.master_url, "--conf", "spark.executor.memory=1g",
             str(ROOT / "jobs" / "train.py"), str(ROOT / "conf" / "digits.toml"),
             "--set", "train.epochs=3", "--set", f"output.dir={tmp_path / 'out'}",
             "--set", f"train.store={tmp_path / 'store'}", "--set", "train.progress=false"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        daemons = [p for p, _ in cluster._procs]
    # the preset's local[2] did not override spark-submit's --master
    assert f"spark master: {cluster.master_url}" in proc.stdout
    run = tmp_path / "out" / (tmp_path / "out" / "LATEST").read_text().strip()
    assert (run / "model" / "weights.pt").is_file()
    assert len(json.loads((run / "history.json").read_text())) == 3
    assert all(p.poll() is not None for p in daemons)  # master and worker are gone
