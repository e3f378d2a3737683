"""TorchModel's persistence: the folder ``save`` writes (Spark ML metadata, weights.pt, the
torch.export program, history.json, and pickled code only where a model needs it) and how
``load`` reads it back: tensors only, the program checked, every missing or damaged file a
StoreError naming it."""
from __future__ import annotations

import io
import json
import os
import time
from typing import Any

from pyspark.ml.util import DefaultParamsReader, MLReader, MLWriter

from sparkddl.checkpoint.safe import load_plain
from sparkddl.errors import SparkDDLError, StoreError, UntrustedArtifactError
from sparkddl.export import program as exported
from sparkddl.ml import architecture
from sparkddl.session import cluster_context
from sparkddl.store import Store, decode_hadoop_uri
from sparkddl.train.components import model_factory

# what the model keeps of its fit, set from the metadata as saved
FIT_FIELDS = ("task", "output_width", "run_id", "chosen_epoch", "best_by", "epochs_done",
              "stopped_early")
# what ModelReader.load reads from the metadata without a default
REQUIRED = ("uid", "paramMap", "architecture") + FIT_FIELDS


def _metadata(path: str, spark: Any) -> dict[str, Any]:
    """The saved model's metadata; StoreError if ``path`` holds no saved model (Spark would
    raise an AnalysisException naming only the metadata folder)."""
    store = _qualified(spark, path)
    if not store.exists(store.url("metadata")):
        what = "does not exist" if not store.exists(store.url()) else \
            "has no metadata/ folder, so it is not a saved model"
        raise StoreError(f"cannot load a TorchModel from {path} ({store.url()}): it {what}. "
                         "Give the path passed to model.save() / model.write().save(), as "
                         "this driver sees it")
    try:
        meta = json.loads(spark.read.text(os.path.join(path, "metadata")).first()[0])
    except Exception as exc:  # noqa: BLE001 - JSONDecodeError, Hadoop's ChecksumException, ...
        raise StoreError(f"cannot load a TorchModel from {path}: its metadata/ cannot be read "
                         f"as the JSON model.save() writes ({_cause(exc)}); save the model "
                         "again") from None
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
        raise StoreError(f"cannot load a TorchModel from {path}: its metadata lacks "
                         f"{', '.join(missing)}, which model.save() writes; it was edited or "
                         "written by something else: save the model again")
    return meta


def _write_metadata(m: Any, spark: Any, path: str, extra: dict[str, Any]) -> None:
    """The Spark ML metadata, one JSON line in metadata/ as pyspark.ml's DefaultParamsWriter
    writes it (so pyspark's readers read it), written through the DataFrame API on every
    Spark: pyspark 3.5's writer asks a SparkContext to parallelize it, and a Spark Connect
    client has none."""
    meta = {"class": f"{type(m).__module__}.{type(m).__name__}",
            "timestamp": int(round(time.time() * 1000)), "sparkVersion": spark.version,
            "uid": m.uid, "paramMap": {p.name: v for p, v in m._paramMap.items()},
            "defaultParamMap": {p.name: v for p, v in m._defaultParamMap.items()}, **extra}
    (spark.createDataFrame([(json.dumps(meta, separators=(",", ":")),)], "value string")
     .coalesce(1).write.text(os.path.join(path, "metadata")))


def _cause(exc: BaseException) -> str:
    """One line saying what went wrong: a JVM error's innermost cause, else the first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if line.startswith("Caused by:")]
    if causes:
        return causes[-1][len("Caused by:"):].strip()[:300]
    return f"{type(exc).__name__}: {' '.join(lines[:2])[:300]}"


def _saved(store: Store, name: str, path: str) -> bytes:
    """The bytes of the saved model's file ``name``; StoreError naming it if it is gone."""
    url = store.url(name)
    try:
        return store.read_bytes(url)
    except FileNotFoundError:
        raise StoreError(f"the saved model at {path} lacks {name} ({url}): it was not "
                         "written completely, or changed since; save the model again") from None


def _qualified(spark: Any, path: str) -> Store:
    """The Store for ``path`` as Spark's Hadoop filesystem resolves it (default FS included);
    on Spark Connect, as this client sees it (there is no JVM here to ask)."""
    if not cluster_context(spark).has_jvm:
        return Store.from_uri(path)
    jvm = spark.sparkContext._jvm
    jpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = jpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return Store.from_uri(decode_hadoop_uri(str(fs.makeQualified(jpath).toUri().toString())))


class ModelWriter(MLWriter):
    def __init__(self, instance: Any):
        super().__init__()
        self.instance = instance

    def _handleOverwrite(self, path: str) -> None:  # noqa: N802 - MLWriter's name
        """pyspark asks the JVM to clear the folder; a Connect client has none here."""
        if cluster_context(self.sparkSession).has_jvm:
            super()._handleOverwrite(path)
            return
        store = Store.from_uri(path)
        store.delete(store.url())

    def saveImpl(self, path: str) -> None:  # noqa: N802 - MLWriter's name
        import torch
        from pyspark import cloudpickle
        m = self.instance
        program = m.program()
        extra = {"architecture": m._arch, "task": m.task, "output_width": m.output_width,
                 "run_id": m.run_id,
                 "chosen_epoch": m.chosen_epoch, "best_by": m.best_by,
                 "epochs_done": m.epochs_done, "stopped_early": m.stopped_early,
                 "inputs": [s.to_json() for s in m.input_specs],
                 "program": {"parameters": list(program.parameters)} if program else None,
                 "export_error": m.export_error, "trained_on_gpu": m.trained_on_gpu,
                 "transform": architecture.describe_function(m._transform_fn)
                 if m._transform_fn is not None else None,
                 "input_columns": m._input_columns}
        _write_metadata(m, self.sparkSession, path, extra)
        store = _qualified(self.sparkSession, path)
        buf = io.BytesIO()
        torch.save(m._state, buf)
        store.write_bytes(store.url("weights.pt"), buf.getvalue())
        store.write_bytes(store.url("history.json"), json.dumps(m.history).encode())
        if program is not None:
            exported.write(store, program)
        if m._arch["kind"] == "pickle" and m._factory is not None:
            store.write_bytes(store.url("architecture.pkl"), cloudpickle.dumps(m._factory))
        if extra["transform"] is not None and extra["transform"]["kind"] == "pickle":
            store.write_bytes(store.url("transform.pkl"), cloudpickle.dumps(m._transform_fn))


class ModelReader(MLReader):
    """Reads a saved model into a new ``model_class`` (TorchModel: passed in, as this module
    sits below it)."""

    def __init__(self, model_class: type, model: Any = None, transform: Any = None):
        super().__init__()
        self.model_class, self.model, self.transform = model_class, model, transform

    def load(self, path: str) -> Any:
        meta = _metadata(path, self.sparkSession)
        store = _qualified(self.sparkSession, path)
        m = self.model_class()
        m._resetUid(meta["uid"])
        DefaultParamsReader.getAndSetParams(m, meta)
        m._arch = meta["architecture"]
        m.input_specs = tuple(exported.InputSpec.from_json(d) for d in meta.get("inputs", []))
        m.export_error = meta.get("export_error", "")
        m.trained_on_gpu = bool(meta.get("trained_on_gpu", False))
        weights = store.url("weights.pt")
        m._state = load_plain(_saved(store, "weights.pt", path), weights, UntrustedArtifactError,
                              map_location="cpu")
        saved = meta.get("program")
        program = exported.read(store, saved["parameters"], architecture.is_trusted()) \
            if saved and self.model is None else None
        if self.model is not None:
            m._factory = model_factory(self.model)
            m._arch = architecture.describe(m._factory)
        elif program is not None:  # no code of the model's is imported or unpickled
            m._program, m._export_tried = program, True
        else:
            try:
                module = architecture.rebuild(
                    m._arch, lambda: _saved(store, "architecture.pkl", path), path)
            except SparkDDLError as exc:
                if saved:  # saved with a program, which would need none of this: it is gone
                    raise SparkDDLError(f"{exc}. It was saved with {exported.GRAPH_FILE}, which "
                                        "needs none of this, but that file is missing: save "
                                        "the model again") from exc
                if not m.export_error:
                    raise
                raise SparkDDLError(f"{exc}. It was saved without a torch.export program, "
                                    f"which needs none of this, because exporting it failed: "
                                    f"{m.export_error}") from exc
            m._factory = model_factory(module)
        try:
            m._build().load_state_dict(m._state)
        except SparkDDLError:
            raise
        except Exception as exc:  # RuntimeError, torch.export's SpecViolationError, ...
            if self.model is not None:  # the caller's module: torch's own error says it all
                raise
            raise StoreError(f"the saved model at {path}: weights.pt does not fit its "
                             f"architecture ({_cause(exc)}). Save the model again") from None
        m._input_columns = dict(meta.get("input_columns") or {})
        saved_transform = meta.get("transform")
        if self.transform is not None:
            m._transform_fn = self.transform
        elif saved_transform is not None:
            m._transform_fn = architecture.rebuild_function(
                saved_transform, lambda: _saved(store, "transform.pkl", path), path)
        try:
            m.history = json.loads(_saved(store, "history.json", path))
        except ValueError as exc:
            raise StoreError(f"the saved model at {path}: history.json is not JSON ({exc}); "
                             "save the model again") from None
        for key in FIT_FIELDS:
            setattr(m, key, meta[key])
        return m
