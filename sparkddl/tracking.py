"""MLflow, from the driver only: the ranks need no MLflow credentials.

``TorchEstimator(mlflow=...)``: None (the default) logs when MLflow is installed and a run is
active on the calling thread, as in a Databricks notebook; True also starts a run when none
is (and ends it); False turns logging off. A run that a fit has logged to already gets each
further fit as a child run (a tuning loop, CrossValidator). What is logged:

- every Param of the estimator, as MLflow params;
- every history row as metrics with ``step=epoch``, as each snapshot is evaluated, so the
  MLflow UI draws the curves while training runs;
- each restart as a tag (``sparkddl.restart.<attempt>``), and the outcome as tags;
- at the end, the model (:func:`log_model`): an MLflow model whose ``pytorch`` flavor is the
  torch.export program (``mlflow.pytorch.load_model`` gives a module, with no unpickling) and
  whose ``python_function`` flavor runs that program with :mod:`sparkddl.portable`, so
  ``mlflow.pyfunc.load_model(uri).predict(df)`` returns what ``TorchModel.transform``
  predicts, where only mlflow and torch are installed.

MLflow calls made while training run on a thread of their own, so a slow tracking server
never holds up the fit. The first failure (an unreachable server, a deleted run) turns logging
off for the rest of the fit with one warning; training goes on.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from typing import Any, Callable
from urllib.parse import urlparse

from sparkddl.errors import ConfigError

log = logging.getLogger(__name__)

SETTINGS = (None, "auto", True, False)
MODEL_NAME = "model"  # the model's artifact path in the run
PROBE_TIMEOUT_S = 3.0
DRAIN_TIMEOUT_S = 300.0


def check_setting(value: Any) -> None:
    if not any(value is s or (isinstance(s, str) and value == s) for s in SETTINGS):
        raise ConfigError(f"mlflow={value!r}: use None (log when an MLflow run is active), "
                          "True (start a run if none is) or False (off)")
    if value is True:
        try:
            import mlflow  # noqa: F401
        except ImportError as exc:
            raise ConfigError("mlflow=True but mlflow is not installed; pip install "
                              "'sparkddl[mlflow]' (or mlflow-skinny), or set mlflow=False"
                              ) from exc


def unreachable(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why an http(s) tracking server cannot be reached (a TCP connect), else None; other
    URIs (files, databases, databricks) are not probed."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"cannot connect to {parsed.hostname}:{port} ({exc})"
    return None


class MlflowTracking:
    """One fit's MLflow logging. ``on_epoch_end`` and ``on_restart`` are Callbacks hooks
    (they run on the driver's evaluator and fit threads); ``begin`` and ``finish`` run on the
    caller's thread."""

    def __init__(self, run_id: str, started_here: bool):
        from mlflow.tracking import MlflowClient
        self.client = MlflowClient()
        self.run_id, self.started_here = run_id, started_here
        self.failed: str | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="sparkddl-mlflow", daemon=True)
        self._thread.start()

    @classmethod
    def begin(cls, setting: Any, params: dict[str, Any]) -> "MlflowTracking | None":
        """Start logging for a fit with these Params, or None when it is off (or MLflow cannot
        be reached: one warning, and the fit goes on)."""
        check_setting(setting)
        if setting is False:
            return None
        try:
            import mlflow
        except ImportError:
            return None
        active = mlflow.active_run()
        if active is None and setting is not True:
            return None
        uri = mlflow.get_tracking_uri()
        why = unreachable(uri)
        started = False
        try:
            if why is None and active is not None and _has_a_fit(active.info.run_id):
                # a second fit in the same run (CrossValidator, a loop in a notebook): its
                # params would clash with the first one's, so it gets a child run
                active, started = mlflow.start_run(nested=True), True
            elif why is None and active is None:
                active, started = mlflow.start_run(), True
        except Exception as exc:  # noqa: BLE001 - training goes on without MLflow
            why = f"cannot start a run: {type(exc).__name__}: {exc}"
        if why is not None:
            log.warning("MLflow tracking at %s: %s; training goes on without MLflow logging",
                        uri, why)
            return None
        tracking = cls(active.info.run_id, started)
        tracking._submit(lambda c, run: _log_params(c, run, params))
        from sparkddl import __version__
        tracking._submit(lambda c, run: c.set_tag(run, "sparkddl.version", __version__))
        return tracking

    # ---- Callbacks hooks ----
    def on_epoch_end(self, row: dict[str, Any]) -> None:
        epoch = int(row.get("epoch", 0))
        stamp = int(time.time() * 1000)
        values = {k: float(v) for k, v in row.items()
                  if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if values:
            self._submit(lambda c, run: _log_metrics(c, run, values, epoch, stamp))

    def on_restart(self, restart: Any) -> None:
        text = (f"{restart.reason} | resumed from epoch {restart.resumed_from_epoch} step "
                f"{restart.resumed_from_step}, {restart.steps_redone} steps redone")
        attempt = restart.attempt
        self._submit(lambda c, run: c.set_tag(run, f"sparkddl.restart.{attempt}", text[:5000]))

    # ---- the end ----
    def finish(self, model: Any = None, dataset: Any = None, error: Any = None) -> str | None:
        """Log the outcome (and the model, when the fit succeeded); end the run if it was
        started here. The model's URI, or None when it was not logged."""
        uri = None
        try:
            if model is not None:
                tags = {"sparkddl.run_id": model.run_id,
                        "sparkddl.chosen_epoch": str(model.chosen_epoch),
                        "sparkddl.best_by": model.best_by,
                        "sparkddl.epochs_done": str(model.epochs_done),
                        "sparkddl.stopped_early": str(model.stopped_early),
                        "sparkddl.restarts": str(len(model.restarts))}
                self._submit(lambda c, run: [c.set_tag(run, k, v) for k, v in tags.items()])
            elif error is not None:
                text = f"{type(error).__name__}: {error}"[:5000]
                self._submit(lambda c, run: c.set_tag(run, "sparkddl.error", text))
            self._drain()
            if model is not None and self.failed is None:
                try:
                    uri = log_model(model, dataset, self.run_id)
                except Exception as exc:  # noqa: BLE001 - the fit itself succeeded
                    log.warning("MLflow: could not log the model to run %s: %s: %s",
                                self.run_id, type(exc).__name__, exc)
        finally:
            if self.started_here:
                self._end_run("FINISHED" if error is None else "FAILED")
        return uri

    def _end_run(self, status: str) -> None:
        import mlflow
        try:
            active = mlflow.active_run()
            if active is not None and active.info.run_id == self.run_id:
                mlflow.end_run(status)
        except Exception as exc:  # noqa: BLE001
            log.warning("MLflow: could not end run %s: %s", self.run_id, exc)

    # ---- the MLflow thread ----
    def _submit(self, call: Callable[[Any, str], Any]) -> None:
        if self.failed is None:
            self._queue.put(call)

    def _drain(self) -> None:
        self._queue.put(None)
        self._thread.join(DRAIN_TIMEOUT_S)
        if self._thread.is_alive() and self.failed is None:
            self.failed = f"still busy after {DRAIN_TIMEOUT_S:.0f} s"
            log.warning("MLflow: run %s was %s; the model is not logged", self.run_id,
                        self.failed)

    def _loop(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            if self.failed is not None:
                continue
            try:
                call(self.client, self.run_id)
            except Exception as exc:  # noqa: BLE001 - one warning, then logging is off
                self.failed = f"{type(exc).__name__}: {str(exc).strip()[:500]}"
                log.warning("MLflow logging to run %s failed (%s); it is off for the rest of "
                            "this fit, and training goes on", self.run_id, self.failed)


def _has_a_fit(run_id: str) -> bool:
    """Whether a fit has logged to this run already."""
    from mlflow.tracking import MlflowClient
    return "sparkddl.version" in MlflowClient().get_run(run_id).data.tags


def _log_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param
    try:
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH as limit
    except ImportError:
        limit = 500
    items = [Param(k, param_text(v)[:limit]) for k, v in sorted(params.items())]
    for i in range(0, len(items), 100):  # MLflow's batch limit
        client.log_batch(run_id, params=items[i:i + 100])


def _log_metrics(client: Any, run_id: str, values: dict[str, float], epoch: int,
                 stamp: int) -> None:
    from mlflow.entities import Metric
    client.log_batch(run_id, metrics=[Metric(k, v, stamp, epoch) for k, v in values.items()])


def param_text(value: Any) -> str:
    """A Param's value as MLflow param text: JSON for plain data, else a short description
    (a module's class, a function's name)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return str(value)
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        pass
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if name:
        return f"{getattr(value, '__module__', '')}.{name}".lstrip(".")
    return repr(value) if len(repr(value)) < 500 else type(value).__name__


# ---- the logged model ----

def log_model(model: Any, dataset: Any, run_id: str) -> str:
    """Log ``model`` (a TorchModel) under the run, with a signature from ``dataset``'s schema
    and a few of its rows as the input example; the model's URI."""
    from mlflow.models import Model

    features = list(model._features())
    signature = signature_for(model, dataset.schema if dataset is not None else None)
    example = input_example(dataset, features) if dataset is not None else None
    program = model.program()
    kwargs: dict[str, Any] = {"run_id": run_id, "torch_model": model, "signature": signature,
                              "input_example": example}
    if program is None:
        log.warning("MLflow: the model could not be exported with torch.export (%s); it is "
                    "logged with mlflow.pytorch's pickle format only, which needs its code "
                    "to load", model.export_error)
        from mlflow.tracking import MlflowClient
        MlflowClient().set_tag(run_id, "sparkddl.export_error", model.export_error[:5000])
    import inspect
    named = "name" in inspect.signature(Model.log).parameters  # MLflow 3 names models
    info = Model.log(None if named else MODEL_NAME, _Flavor(), **kwargs,
                     **({"name": MODEL_NAME} if named else {}))
    return getattr(info, "model_uri", f"runs:/{run_id}/{MODEL_NAME}")


class _Flavor:
    """What ``mlflow.models.Model.log`` calls to write the model's folder."""

    __name__ = "sparkddl"

    @staticmethod
    def save_model(path: str, mlflow_model: Any, torch_model: Any, signature: Any,
                   input_example: Any, **_: Any) -> None:
        save_model(path, mlflow_model, torch_model, signature, input_example)


def save_model(path: str, mlflow_model: Any, model: Any, signature: Any,
               example: Any) -> None:
    import io

    import mlflow
    import numpy as np
    import pandas as pd
    import torch

    from sparkddl import portable
    program = model.program()
    reqs = [f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}",
            f"pandas=={pd.__version__}"]
    if program is None:  # mlflow.pytorch's own flavor and pyfunc, from the pickled module
        mlflow.pytorch.save_model(model.module(), path, mlflow_model=mlflow_model,
                                  serialization_format="pickle", pip_requirements=reqs)
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "sparkddl")
        os.makedirs(data)
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        cols = {"prediction": model.getPredictionCol(),
                "probability": model.getOrDefault(model.probabilityCol),
                "raw": model.getOrDefault(model.rawPredictionCol)}
        meta = {"inputs": [s.to_json() for s in model.input_specs], "task": model.task,
                "output_width": model.output_width, "columns": cols,
                "parameters": list(program.parameters),
                "batch_rows": model.getOrDefault(model.inferenceBatchSize),
                "sparkddl_run_id": model.run_id}
        for name, blob in ((portable.META_FILE, json.dumps(meta, indent=1).encode()),
                           (portable.WEIGHTS_FILE, buf.getvalue()),
                           (portable.GRAPH_FILE, program.graph),
                           (portable.CONSTANTS_FILE, program.constants),
                           (portable.INPUTS_FILE, program.example_inputs)):
            with open(os.path.join(data, name), "wb") as f:
                f.write(blob)
        code = os.path.join(tmp, "sparkddl_portable.py")
        shutil.copyfile(portable.__file__, code)
        mlflow.pyfunc.save_model(path, loader_module="sparkddl_portable", data_path=data,
                                 code_paths=[code], mlflow_model=mlflow_model,
                                 signature=signature, input_example=example,
                                 pip_requirements=reqs)
    # the pytorch flavor: the same program in torch.export's own format, which
    # mlflow.pytorch.load_model reads after checking it holds no pickles
    from sparkddl.exported import program_of
    os.makedirs(os.path.join(path, "pytorch"))
    torch.export.save(program_of(program, model.state_dict()),
                      os.path.join(path, "pytorch", "model.pt2"))
    mlflow_model.add_flavor("pytorch", model_data="pytorch",
                            pytorch_version=str(torch.__version__), code=None)
    mlflow_model.save(os.path.join(path, "MLmodel"))


def signature_for(model: Any, schema: Any) -> Any:
    """The pyfunc signature: the feature columns as the DataFrame has them, and the columns
    transform adds."""
    from mlflow.models import ModelSignature
    from mlflow.types import DataType
    from mlflow.types.schema import Array, ColSpec, Schema

    from sparkddl.problems import Problem
    fields = {f.name: f.dataType for f in schema.fields} if schema is not None else {}

    def mlflow_type(t: Any) -> Any:
        name = type(t).__name__
        if name == "ArrayType":
            return Array(mlflow_type(t.elementType))
        if name == "VectorUDT":
            return Array(DataType.double)
        # floats as double: pandas users pass float64, which MLflow will not narrow; the
        # model's inputs are made float32 after the check
        return {"IntegerType": DataType.integer,
                "ShortType": DataType.integer, "ByteType": DataType.integer,
                "LongType": DataType.long, "BooleanType": DataType.boolean,
                }.get(name, DataType.double)

    inputs = []
    for spec in model.input_specs:
        t = fields.get(spec.name)
        inputs.append(ColSpec(mlflow_type(t) if t is not None else
                              (Array(DataType.double) if spec.shape else DataType.double),
                              spec.name))
    outputs = []
    if Problem(model.task).is_classifier:
        outputs = [ColSpec(DataType.double, model.getPredictionCol()),
                   ColSpec(Array(DataType.double), model.getOrDefault(model.probabilityCol)),
                   ColSpec(Array(DataType.double), model.getOrDefault(model.rawPredictionCol))]
    elif model.output_width == 1:
        outputs = [ColSpec(DataType.double, model.getPredictionCol())]
    else:
        outputs = [ColSpec(Array(DataType.double), model.getPredictionCol())]
    return ModelSignature(Schema(inputs), Schema(outputs))


def input_example(dataset: Any, features: list[str], rows: int = 3) -> Any:
    """A few rows of the feature columns, as pandas (vectors and arrays as lists)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F
    types = {f.name: type(f.dataType).__name__ for f in dataset.schema.fields}
    cols = [vector_to_array(F.col(f"`{f}`")).alias(f) if types.get(f) == "VectorUDT"
            else F.col(f"`{f}`") for f in features]
    pdf = dataset.select(*cols).limit(rows).toPandas()
    for f in features:
        if types.get(f) in ("VectorUDT", "ArrayType"):
            pdf[f] = pdf[f].map(lambda v: [float(x) for x in v])
    return pdf
