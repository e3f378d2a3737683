"""The MLflow model a fit logs: a ``pytorch`` flavor in torch.export's format and a
``python_function`` flavor that runs the program with a copy of :mod:`sparkddl.export.portable`
(which checks it first), so pyfunc predicts where only mlflow and torch are installed."""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Any

log = logging.getLogger("sparkddl.tracking")

MODEL_NAME = "model"  # the model's artifact path in the run


def log_model(model: Any, run_id: str, schema: Any = None, example: Any = None) -> str:
    """Log ``model`` (a TorchModel) under the run, with a signature from the training
    DataFrame's ``schema`` and ``example`` (pandas) as the input example; the model's URI."""
    from mlflow.models import Model

    if model._transform_fn is not None:
        raise RuntimeError("the model has a transformFn, which its MLflow pyfunc could not run "
                           "without the code; save it with TorchModel.save (or log it "
                           "yourself with mlflow.pytorch)")
    signature = signature_for(model, schema)
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
    info = Model.log(None if named else MODEL_NAME, _Flavor(), **kwargs,  # pyright: ignore[reportArgumentType]
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

    from sparkddl.export import portable
    program = model.program()
    reqs = [f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}",
            f"pandas=={pd.__version__}"]
    import inspect
    # MLflow versions that read torch.export's .pt2 in mlflow.pytorch (and would save pt2 by
    # default) take serialization_format; older ones only pickle
    pt2 = "serialization_format" in inspect.signature(mlflow.pytorch.save_model).parameters  # pyright: ignore[reportPrivateImportUsage]
    if program is None:  # mlflow.pytorch's own flavor and pyfunc, from the pickled module
        mlflow.pytorch.save_model(model.module(), path, mlflow_model=mlflow_model,  # pyright: ignore[reportPrivateImportUsage]
                                  pip_requirements=reqs,
                                  **({"serialization_format": "pickle"} if pt2 else {}))  # pyright: ignore[reportArgumentType]
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
        loader = portable_module_name()
        # the checker's copy under the name the loader imports it by
        checker = loader.replace("portable", "program_check")
        code = [os.path.join(tmp, f"{name}.py") for name in (loader, checker)]
        for module, copy in zip(_loader_modules(), code):
            shutil.copyfile(module.__file__, copy)
        mlflow.pyfunc.save_model(path, loader_module=loader, data_path=data,
                                 code_paths=code, mlflow_model=mlflow_model,
                                 signature=signature, input_example=example,
                                 pip_requirements=reqs)
    if not pt2:  # this MLflow's pytorch flavor could not read it
        return
    # the pytorch flavor: the same program in torch.export's own format, which
    # mlflow.pytorch.load_model reads after checking it holds no pickles
    from sparkddl.export.program import program_of
    os.makedirs(os.path.join(path, "pytorch"))
    torch.export.save(program_of(program, model.state_dict()),
                      os.path.join(path, "pytorch", "model.pt2"))
    mlflow_model.add_flavor("pytorch", model_data="pytorch",
                            pytorch_version=str(torch.__version__), code=None)
    mlflow_model.save(os.path.join(path, "MLmodel"))


def portable_module_name() -> str:
    """The pyfunc loader's module name in a logged model: versioned by its content (and its
    checker's), as MLflow imports it by name and a serving process may load models of
    several versions."""
    import hashlib

    digest = hashlib.sha256()
    for module in _loader_modules():
        with open(str(module.__file__), "rb") as f:
            digest.update(f.read())
    return f"sparkddl_portable_{digest.hexdigest()[:12]}"


def _loader_modules() -> tuple[Any, Any]:
    """What a logged model's pyfunc runs: sparkddl.export.portable and the checker it imports."""
    from sparkddl.export import portable, program_check
    return portable, program_check


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
        # integers as long: pandas' default int64, which MLflow will not narrow to int32
        return {"IntegerType": DataType.long, "ShortType": DataType.long,
                "ByteType": DataType.long, "LongType": DataType.long,
                "BooleanType": DataType.boolean}.get(name, DataType.double)

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
    return ModelSignature(Schema(inputs), Schema(outputs))  # pyright: ignore[reportArgumentType]


def input_example(dataset: Any, features: list[str], rows: int = 3) -> Any:
    """A few rows of the feature columns, as pandas (vectors and arrays as lists)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F
    types = {f.name: type(f.dataType).__name__ for f in dataset.schema.fields}
    cols = [vector_to_array(F.col(f"`{f}`")).alias(f) if types.get(f) == "VectorUDT"
            else F.col(f"`{f}`") for f in features]
    pdf = dataset.select(*cols).limit(rows).toPandas()
    for f in features:
        if types.get(f) in ("VectorUDT", "ArrayType"):  # lists, their items as Python's
            pdf[f] = pdf[f].map(lambda v: [x.item() if hasattr(x, "item") else x
                                           for x in v])
    return pdf
