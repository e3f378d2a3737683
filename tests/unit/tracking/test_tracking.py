"""MLflow logging from the driver against a real tracking store (sqlite, local artifacts): the
logged model, its pyfunc and pytorch flavors, and failures that must not stop training."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch

mlflow = pytest.importorskip("mlflow")  # pinned in all three tested stacks

from sparkddl import tracking  # noqa: E402
from sparkddl.errors import ConfigError  # noqa: E402
from sparkddl.export import program as exported  # noqa: E402
from sparkddl.fit.restarts import Restart  # noqa: E402
from sparkddl.ml.model import TorchModel  # noqa: E402
from sparkddl.problems import Problem  # noqa: E402
from tests.unit.export.test_program import Branchy  # noqa: E402

SPECS = (exported.InputSpec("features", (6,), "float32"),)


@pytest.fixture
def store(mlflow_store):
    return mlflow_store


def _model(task=Problem.MULTICLASS) -> TorchModel:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model = TorchModel()
    model._factory, model._state = (lambda: net), net.state_dict()
    model._arch = {"kind": "pickle"}
    model.input_specs, model.task, model.output_width = SPECS, task, 3
    model.run_id, model.chosen_epoch = "r1", 2
    return model


def _frame(rows=37) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"features": list(rng.standard_normal((rows, 6)))})


def test_settings_are_checked_on_the_driver():
    for ok in (None, "auto", True, False):
        tracking.check_setting(ok)
    with pytest.raises(ConfigError, match="mlflow='yes'.*None.*True.*False"):
        tracking.check_setting("yes")


def test_param_text_is_readable():
    assert tracking.param_text(3) == "3" and tracking.param_text(None) == "None"
    assert tracking.param_text(["a", "b"]) == '["a", "b"]'
    assert tracking.param_text(torch.optim.Adam) == "torch.optim.adam.Adam"
    assert tracking.param_text(torch.nn.Linear(2, 2)) == "Linear(in_features=2, " \
                                                         "out_features=2, bias=True)"


def test_an_unreachable_server_is_found_by_a_quick_probe():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    why = tracking.unreachable(f"http://127.0.0.1:{port}", timeout_s=2)
    assert why is not None and f"127.0.0.1:{port}" in why
    assert tracking.unreachable("sqlite:///x.db") is None
    assert tracking.unreachable("databricks") is None


def test_nothing_is_logged_without_an_active_run_unless_asked(store):
    assert tracking.MlflowTracking.begin(None, {"epochs": 3}) is None
    assert tracking.MlflowTracking.begin(False, {"epochs": 3}) is None
    assert mlflow.search_runs(output_format="list") == []


def test_the_default_does_not_import_mlflow_where_the_caller_has_not():
    """No run can be active in a process that never imported MLflow: a first fit there must
    not pay MLflow's import (2.5 s cold) to find that out."""
    code = textwrap.dedent("""
        import sys
        from sparkddl.tracking.runs import MlflowTracking
        assert MlflowTracking.begin(None, {"epochs": 1}) is None
        assert "mlflow" not in sys.modules, "the default setting imported mlflow"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_params_metrics_per_epoch_and_restarts_reach_the_run(store):
    with mlflow.start_run() as run:
        t = tracking.MlflowTracking.begin(None, {"epochs": 3, "model": torch.nn.Linear(2, 2),
                                                "featuresCol": "features"})
        assert t is not None and not t.started_here
        for epoch in (1, 2, 3):
            t.on_epoch_end({"epoch": epoch, "train_loss": 1.0 / epoch, "val_accuracy":
                            0.5 + epoch / 10, "note": "text is skipped", "flag": True})
        t.on_restart(Restart(0, "rank 1 failed: boom", 1, 4, 3, 0.0))
        assert t.finish() is None  # no model: nothing to log, the caller's run stays open
        assert mlflow.active_run().info.run_id == run.info.run_id
    data = store.get_run(run.info.run_id).data
    assert data.params["epochs"] == "3" and data.params["featuresCol"] == "features"
    assert data.params["model"].startswith("Linear(")
    history = store.get_metric_history(run.info.run_id, "val_accuracy")
    assert [(m.step, round(m.value, 6)) for m in history] == [(1, 0.6), (2, 0.7), (3, 0.8)]
    assert set(data.metrics) == {"train_loss", "val_accuracy"}
    assert data.tags["sparkddl.restart.0"].startswith("rank 1 failed: boom | resumed from "
                                                      "epoch 1 step 4")


def test_a_second_fit_in_the_same_run_gets_a_child_run(store):
    with mlflow.start_run() as parent:
        first = tracking.MlflowTracking.begin(None, {"epochs": 3})
        first.finish()
        second = tracking.MlflowTracking.begin(None, {"epochs": 5})  # would clash: a child
        assert second.started_here and second.run_id != parent.info.run_id
        second.finish()
        assert mlflow.active_run().info.run_id == parent.info.run_id  # the child was ended
    child = store.get_run(second.run_id)
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.params["epochs"] == "5" and child.info.status == "FINISHED"
    assert store.get_run(parent.info.run_id).data.params["epochs"] == "3"


def test_a_param_the_caller_logged_keeps_its_value_and_logging_goes_on(store, caplog):
    with mlflow.start_run() as run:
        mlflow.log_param("epochs", 20)
        with caplog.at_level(logging.WARNING, logger="sparkddl.tracking"):
            t = tracking.MlflowTracking.begin(None, {"epochs": 3, "batchSize": 32})
            t.on_epoch_end({"epoch": 1, "train_loss": 0.5})
            t.finish()
    data = store.get_run(run.info.run_id).data
    assert data.params == {"epochs": "20", "batchSize": "32"} and data.metrics["train_loss"]
    assert t.failed is None
    [warning] = [r for r in caplog.records if r.name == "sparkddl.tracking"]
    assert "already has the param(s) epochs" in warning.getMessage()


def test_a_fit_on_another_thread_never_touches_the_callers_run(store):
    """CrossValidator fits on a thread pool, where MLflow sees no active run."""
    from concurrent.futures import ThreadPoolExecutor

    def fit(setting):
        t = tracking.MlflowTracking.begin(setting, {"epochs": 2})
        if t is not None:
            t.finish()
        return t

    with mlflow.start_run() as caller, ThreadPoolExecutor(2) as pool:
        assert pool.submit(fit, None).result() is None  # no run on that thread: nothing
        own = [pool.submit(fit, True) for _ in range(2)]
        runs = [f.result().run_id for f in own]
        assert mlflow.active_run().info.run_id == caller.info.run_id
    assert len(set(runs)) == 2 and caller.info.run_id not in runs
    assert all(store.get_run(r).info.status == "FINISHED" for r in runs)
    assert store.get_run(caller.info.run_id).data.params == {}


def test_a_deleted_run_gives_one_warning_and_logging_stops(store, caplog):
    with mlflow.start_run() as run:
        t = tracking.MlflowTracking.begin(None, {"epochs": 5})
        store.delete_run(run.info.run_id)
        with caplog.at_level(logging.WARNING, logger="sparkddl.tracking"):
            for epoch in range(1, 6):
                t.on_epoch_end({"epoch": epoch, "train_loss": 1.0})
            assert t.finish(model=_model()) is None
        store.restore_run(run.info.run_id)  # so that the with block can end it
    warnings = [r for r in caplog.records if r.name == "sparkddl.tracking"]
    assert len(warnings) == 1 and "off for the rest of this fit" in warnings[0].getMessage()


def test_a_run_started_here_is_ended_and_an_unreachable_server_is_one_warning(store, caplog):
    t = tracking.MlflowTracking.begin(True, {"epochs": 1})
    # created through the client: MLflow's per-thread active run is left alone
    assert t.started_here and mlflow.active_run() is None
    assert store.get_run(t.run_id).info.status == "RUNNING"
    t.finish(error=RuntimeError("the fit failed"))
    run = store.get_run(t.run_id)
    assert run.info.status == "FAILED" and "the fit failed" in run.data.tags["sparkddl.error"]
    interrupted = tracking.MlflowTracking.begin(True, {"epochs": 1})
    interrupted.finish(error=KeyboardInterrupt())
    assert store.get_run(interrupted.run_id).info.status == "KILLED"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mlflow.set_tracking_uri(f"http://127.0.0.1:{port}")
    with caplog.at_level(logging.WARNING, logger="sparkddl.tracking"):
        assert tracking.MlflowTracking.begin(True, {"epochs": 1}) is None
    warnings = [r for r in caplog.records if r.name == "sparkddl.tracking"]
    assert len(warnings) == 1 and "training goes on" in warnings[0].getMessage()


def _expected(model, frame):
    """What transform writes, computed here from the module's output (not sparkddl code)."""
    with torch.no_grad():
        out = model.module()(torch.tensor(np.stack(frame["features"]), dtype=torch.float32))
    if model.task == Problem.MULTICLASS:
        return out.argmax(1).double().numpy(), torch.softmax(out, 1).double().numpy()
    if model.task == Problem.BINARY:
        p = torch.sigmoid(out.reshape(-1)).double()
        return (out.reshape(-1) > 0).double().numpy(), torch.stack([1 - p, p], 1).numpy()
    return out.reshape(-1).double().numpy(), None


def _kind(task):
    model = _model(task)
    if task != Problem.MULTICLASS:
        torch.manual_seed(1)
        net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1),
                                  torch.nn.Flatten(0))
        model._factory, model._state, model.output_width = (lambda: net), net.state_dict(), 1
    return model


TASKS = (Problem.MULTICLASS, Problem.BINARY, Problem.REGRESSION)


@pytest.mark.timeout(300)
def test_the_logged_models_predict_as_transform_where_sparkddl_is_absent_for_each_task(
        store, tmp_path):
    """A multiclass, a binary and a regression model, each logged in a run of its own, then
    loaded (pyfunc and pytorch flavors) in one process where sparkddl and pyspark cannot be
    imported: one launch checks all three."""
    from pyspark.sql.types import ArrayType, IntegerType, StructField, StructType
    # integer pixels, as an array<int> column: pandas holds them as int64
    frame = pd.DataFrame({"features": list(np.random.default_rng(0).integers(0, 17, (37, 6)))})
    schema = StructType([StructField("features", ArrayType(IntegerType()))])
    frame.to_parquet(tmp_path / "in.parquet")
    models, expected, uris = {}, {}, []
    for task in TASKS:
        model = models[task] = _kind(task)
        expected[task] = _expected(model, frame)
        with mlflow.start_run() as run:
            uri = tracking.log_model(model, run.info.run_id, schema,
                                     frame.head(3).apply(
                                         lambda c: c.map(lambda v: [int(x) for x in v])))
        info = mlflow.models.get_model_info(uri)
        assert info.flavors["python_function"]["loader_module"].startswith(
            "sparkddl_portable_"), task
        assert "pytorch" in info.flavors and info.saved_input_example_info is not None, task
        uris.append(uri)
    script = tmp_path / "predict.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.modules["sparkddl"] = None  # importing it fails: the model must not need it
        sys.modules["pyspark"] = None
        import mlflow, numpy as np, pandas as pd, torch
        mlflow.set_tracking_uri({mlflow.get_tracking_uri()!r})
        df = pd.read_parquet({str(tmp_path / 'in.parquet')!r})
        for i, uri in enumerate({uris!r}):
            out = mlflow.pyfunc.load_model(uri).predict(df)  # the signature is enforced
            out.to_parquet({str(tmp_path)!r} + f"/out{{i}}.parquet")
            module = mlflow.pytorch.load_model(uri)
            x = torch.tensor(np.stack(df["features"]), dtype=torch.float32)
            torch.save(module(x).detach(), {str(tmp_path)!r} + f"/raw{{i}}.pt")
        """))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    for i, (task, model) in enumerate(models.items()):
        prediction, probability = expected[task]
        got = pd.read_parquet(tmp_path / f"out{i}.parquet")
        if probability is None:
            assert list(got.columns) == ["prediction"], task
            assert np.allclose(got["prediction"].to_numpy(), prediction, atol=1e-5), task
        else:
            assert list(got.columns) == ["prediction", "probability", "rawPrediction"], task
            assert (got["prediction"].to_numpy() == prediction).all(), task
            assert np.allclose(np.stack(got["probability"]), probability, atol=1e-6), task
        raw = torch.load(tmp_path / f"raw{i}.pt", weights_only=True)
        with torch.no_grad():
            direct = model.module()(torch.tensor(np.stack(frame["features"]),
                                                 dtype=torch.float32))
        assert np.allclose(raw.numpy(), direct.numpy(), atol=1e-5), task


def test_the_signature_follows_the_dataframe_schema():
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import (
        ArrayType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        StructField,
        StructType,
    )
    model = _model()
    model.input_specs = tuple(exported.InputSpec(n, s, "float32") for n, s in
                              (("a", (3,)), ("b", (3,)), ("c", ()), ("d", ()), ("v", (2,))))
    model.setFeaturesCol(["a", "b", "c", "d", "v"])
    schema = StructType([StructField("a", ArrayType(FloatType())),
                         StructField("b", ArrayType(IntegerType())),
                         StructField("c", LongType()), StructField("d", DoubleType()),
                         StructField("v", VectorUDT())])
    sig = tracking.signature_for(model, schema).to_dict()
    import json
    inputs = {c["name"]: c for c in json.loads(sig["inputs"])}
    assert inputs["a"]["items"]["type"] == "double" and inputs["b"]["items"]["type"] == "long"
    assert inputs["c"]["type"] == "long" and inputs["d"]["type"] == "double"
    assert inputs["v"]["items"]["type"] == "double"
    assert [c["name"] for c in json.loads(sig["outputs"])] == ["prediction", "probability",
                                                               "rawPrediction"]


def test_a_model_that_cannot_be_exported_is_logged_as_a_pickle_and_says_why(store, caplog):
    model = _model()
    net = Branchy()
    model._factory, model._state = (lambda: net), net.state_dict()
    with mlflow.start_run() as run, \
            caplog.at_level(logging.WARNING, logger="sparkddl.tracking"):
        uri = tracking.log_model(model, run.info.run_id)
    assert model.program() is None and model.export_error
    assert "could not be exported" in caplog.text and model.export_error[:40] in caplog.text
    assert store.get_run(run.info.run_id).data.tags["sparkddl.export_error"] == \
        model.export_error
    flavors = mlflow.models.get_model_info(uri).flavors
    assert flavors["python_function"]["loader_module"] == "mlflow.pytorch"
    local = mlflow.artifacts.download_artifacts(uri)
    assert os.path.isfile(os.path.join(local, "data", "model.pth"))  # the pickled module
