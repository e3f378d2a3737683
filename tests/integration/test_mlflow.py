"""MLflow from a real fit (Spark local[2], digits) into a real tracking store (sqlite, local
artifacts): params, curves per epoch, the model as pyfunc where sparkddl is absent, the CLI's
``output.mlflow``, and a run closed while the fit goes on."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

mlflow = pytest.importorskip("mlflow")  # pinned in all three tested stacks

from sparkddl import TorchEstimator  # noqa: E402
from sparkddl.cli import main  # noqa: E402
from tests.integration import test_estimator  # noqa: E402
from tests.integration.digits import digits_df  # noqa: E402
from tests.integration.test_cli import PRESET, outputs  # noqa: E402


def estimator(store, **params) -> TorchEstimator:
    return test_estimator.estimator(store, **{"epochs": 4, **params})


@pytest.fixture
def digits(spark_local):
    df = digits_df(spark_local)
    return df.filter("split != 0"), df.filter("split = 0")


@pytest.mark.timeout(300)
def test_a_fit_in_an_active_run_logs_everything_and_the_model_serves_without_sparkddl(
        digits, mlflow_store, tmp_path):
    train, test = digits
    with mlflow.start_run() as run:
        model = estimator(tmp_path / "st", metrics=["accuracy", "f1"]).fit(train)
    run_id = run.info.run_id
    data = mlflow_store.get_run(run_id).data
    assert data.params["epochs"] == "4" and data.params["numWorkers"] == "2"
    assert data.params["featuresCol"] == "features" and data.params["mlflow"] == "None"
    assert data.tags["sparkddl.run_id"] == model.run_id
    assert data.tags["sparkddl.chosen_epoch"] == str(model.chosen_epoch)
    assert "train_f1" not in data.metrics  # exact metrics: validation only
    for key in ("val_accuracy", "val_f1", "train_loss", "lr"):
        history = mlflow_store.get_metric_history(run_id, key)
        assert [m.step for m in history] == [1, 2, 3, 4], key
        assert np.allclose([m.value for m in history], [r[key] for r in model.history])
    # the model: both flavors, a signature from the DataFrame's schema, an input example
    assert model.mlflow_model_uri
    info = mlflow.models.get_model_info(model.mlflow_model_uri)
    assert {"pytorch", "python_function"} <= set(info.flavors)
    assert info.signature.inputs.input_names() == ["features"]
    assert info.signature.outputs.input_names() == ["prediction", "probability",
                                                    "rawPrediction"]
    assert info.saved_input_example_info is not None
    # served where only mlflow and torch are importable: what transform predicts
    expected = model.transform(test).select("features", "prediction", "probability").toPandas()
    expected[["features"]].to_parquet(tmp_path / "in.parquet")
    script = tmp_path / "serve.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.modules["sparkddl"] = None  # importing it fails
        sys.modules["pyspark"] = None
        import mlflow, pandas as pd
        df = pd.read_parquet({str(tmp_path / 'in.parquet')!r})
        out = mlflow.pyfunc.load_model({model.mlflow_model_uri!r}).predict(df)
        out.to_parquet({str(tmp_path / 'out.parquet')!r})
        """))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    got = pd.read_parquet(tmp_path / "out.parquet")
    assert len(got) == len(expected) > 300
    assert (got["prediction"].to_numpy() == expected["prediction"].to_numpy()).all()
    assert np.allclose(np.stack(got["probability"]),
                       np.stack([v.toArray() for v in expected["probability"]]), atol=1e-5)


class _CloseRun:
    """Ends the MLflow run (as another cell or job would) after the first epoch."""

    def __init__(self):
        self.closed = False

    def on_epoch_end(self, row):
        if not self.closed:
            run = mlflow.search_runs(output_format="list")[0]
            mlflow.tracking.MlflowClient().set_terminated(run.info.run_id, "KILLED")
            self.closed = True


@pytest.mark.timeout(300)
def test_a_run_started_by_the_fit_and_closed_during_it_keeps_all_epochs(digits, mlflow_store,
                                                                        tmp_path):
    train, _ = digits
    assert mlflow.active_run() is None
    closer = _CloseRun()
    model = estimator(tmp_path / "st", epochs=3, mlflow=True, callbacks=[closer]).fit(train)
    assert closer.closed and mlflow.active_run() is None  # the fit ended the run it started
    [run] = mlflow.search_runs(output_format="list")
    history = mlflow_store.get_metric_history(run.info.run_id, "val_accuracy")
    assert [m.step for m in history] == [1, 2, 3]
    assert model.mlflow_model_uri and run.data.tags["sparkddl.run_id"] == model.run_id
    assert run.info.status == "KILLED"  # whoever ended the run keeps its status


@pytest.mark.timeout(300)
def test_sparkddl_train_logs_when_the_preset_says_so(spark_local, mlflow_store, tmp_path,
                                                      capsys):
    args = ["train", PRESET, *outputs(tmp_path), "--set", "train.epochs=2",
            "--set", "output.mlflow=true"]
    assert main(args) == 0
    [run] = mlflow.search_runs(output_format="list")
    assert run.info.status == "FINISHED" and run.data.params["epochs"] == "2"
    assert len(mlflow_store.get_metric_history(run.info.run_id, "val_accuracy")) == 2
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  mlflow  ")]
    flavors = mlflow.models.get_model_info(line.split()[-1]).flavors
    assert flavors["python_function"]["loader_module"].startswith("sparkddl_portable_")
