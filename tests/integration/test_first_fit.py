"""A newcomer's first fit outside the test harness: the README's example run by the
virtualenv's Python with PYSPARK_PYTHON unset, so Spark starts ``python3`` from the PATH for
its workers. That Python lacks sparkddl; the fit must say so at once, naming the executors'
Python and the fix, instead of a page of Java and Python traceback from the first job."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)

FIRST_FIT = textwrap.dedent("""
    import torch
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits
    from sparkddl import TorchEstimator

    spark = SparkSession.builder.master("local[2]").getOrCreate()
    x, y = load_digits(return_X_y=True)
    rows = [([float(v) / 16 for v in image], int(label)) for image, label in zip(x, y)]
    df = spark.createDataFrame(rows, "features array<float>, label long")
    net = torch.nn.Sequential(torch.nn.Linear(64, 10))
    # a table read in place is looked at beside the executors' check; a column missing
    # there still gives way to the executors' Python, the error to fix first
    df.write.parquet(TABLE)
    try:
        TorchEstimator(model=net, optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                       loss=torch.nn.CrossEntropyLoss(), featuresCol="pixels",
                       labelCol="label", numWorkers=2, store=STORE).fit(
                           spark.read.parquet(TABLE))
    except Exception as exc:
        print("IN PLACE:", type(exc).__name__, exc.__context__ is None, str(exc)[:60])
    estimator = TorchEstimator(model=net, optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                               loss=torch.nn.CrossEntropyLoss(), featuresCol="features",
                               labelCol="label", batchSize=32, epochs=1, numWorkers=2,
                               store=STORE)
    estimator.fit(df)
""")


def test_an_executor_python_without_sparkddl_is_named_before_any_job(tmp_path):
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # a Python 3.11 with nothing installed
    assert subprocess.run([str(bare / "bin" / "python3"), "-c", "import sparkddl"],
                          capture_output=True, env={"PATH": "/usr/bin:/bin"},
                          cwd=tmp_path).returncode != 0
    script = tmp_path / "first_fit.py"
    # the driver imports this checkout's sparkddl (as if installed); the executors get no path
    script.write_text(f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                      f"STORE = {str(tmp_path / 'store')!r}\n"
                      f"TABLE = {str(tmp_path / 'table')!r}\n" + FIRST_FIT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    env["PATH"] = f"{bare / 'bin'}:{env.get('PATH', '')}"  # what `python3` means there
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=200)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("sparkddl.errors.ClusterError: the executors' Python"), out
    assert "cannot import sparkddl" in last and "PYSPARK_PYTHON" in last, last
    assert "python3 (Spark's default" in last and sys.executable in last, last
    # the probe caught the import itself: no task failed, no Java traceback to read
    assert "Py4JJavaError" not in out and "PythonException" not in out, out
    assert out.count("Traceback (most recent call last)") == 1, out
    assert not (tmp_path / "store").exists()  # nothing was prepared or written
    assert "IN PLACE: ClusterError True the executors' Python" in out, out  # no chained error

