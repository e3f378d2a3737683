"""notebooks/quickstart.ipynb executed headless against local Spark."""
from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.docs_examples import reader_environment

ROOT = Path(__file__).resolve().parents[2]


def _text(outputs) -> str:
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


@pytest.mark.timeout(420)
def test_quickstart_notebook_runs(tmp_path):
    """In a fresh kernel whose environment is a reader's, without even PYSPARK_PYTHON: the
    notebook points the executors at its own Python."""
    env = {**reader_environment(executors_python=False),
           "SPARKDDL_NOTEBOOK_STORE": str(tmp_path / "store")}
    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not any(o.get("output_type") == "error" for c in code for o in c.outputs)
    text = "\n".join(_text(c.outputs) for c in code)
    run_acc = float(text.split("sparkddl.run accuracy: ")[1].split()[0])
    est_acc = float(text.split("TorchEstimator accuracy: ")[1].split()[0])
    assert run_acc >= 0.9 and est_acc >= 0.9
    assert "[rank 0] rank 0 trained on" in text  # the rank's print reached the notebook
    table = next(c for c in code if "history.round(4)" in c.source)
    assert "text/html" in table.outputs[0]["data"] and "val_accuracy" in _text(table.outputs)
    assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs)
    assert os.path.isdir(tmp_path / "store" / "data")  # the data went through the store
    assert "spark.stop()" in code[-1].source and "on_databricks" in code[-1].source
