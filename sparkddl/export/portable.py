"""What a saved model needs to predict, with only torch, numpy and pandas installed.

This module imports nothing from sparkddl: it is the code executors run in
``TorchModel.transform`` (through :mod:`sparkddl.ml.inference`), what ``TorchModel.load``
uses to rebuild an exported model (through :mod:`sparkddl.export.program`), and, copied into an
MLflow model as ``code/sparkddl_portable_<hash>.py``, the MLflow ``python_function`` loader, so a
logged model loads and predicts where sparkddl is not installed.

In an MLflow model its folder ``sparkddl/`` holds ``meta.json`` (inputs, task, output
columns), the weights and the torch.export program's parts; nothing in it is unpickled, and
the program's JSON is checked against what sparkddl's export writes before torch reads it
(:mod:`sparkddl.export.program_check`): torch's deserializer turns some of its text into code.
"""
from __future__ import annotations

import importlib
import io
import json
import os
from typing import Any

# sparkddl.export.program_check; in an MLflow model, the copy beside this one, named alike
# (sparkddl_portable_<hash> -> sparkddl_program_check_<hash>, see sparkddl.tracking)
_check = importlib.import_module(__name__.replace("portable", "program_check"))
UntrustedProgramError = _check.UntrustedProgramError
TRUST_HINT: str = _check.TRUST_HINT

MULTICLASS, BINARY = "multiclass", "binary"  # sparkddl.problems.Problem's values

# file names inside a saved model
GRAPH_FILE = "program.json"
CONSTANTS_FILE = "program-constants.pt"
INPUTS_FILE = "program-inputs.pt"
WEIGHTS_FILE = "weights.pt"
META_FILE = "meta.json"


def deserialize_program(graph: bytes, constants: bytes, example_inputs: bytes,
                        parameters: Any, state: dict[str, Any], trusted: bool = False,
                        where: str = GRAPH_FILE) -> Any:
    """The ``torch.export.ExportedProgram`` from torch.export's JSON graph, tensors read with
    ``weights_only`` and the weights in ``state``; no pickled code is run.

    Unless ``trusted``, torch reads a checked copy of the graph (``checked_graph``) and
    the tensors must be what sparkddl writes; anything else raises UntrustedProgramError
    naming ``where`` and the field. ``trusted`` (files you trust) reads the graph as it is."""
    import torch
    from torch._export.serde.serialize import SerializedArtifact, deserialize

    if not trusted:
        graph = _check.checked_graph(graph, where)
    consts, examples = _tensors(constants, {}), _tensors(example_inputs, ())
    if not trusted:
        _check_tensors(consts, examples, where)
    params = set(parameters)
    weights = {k: torch.nn.Parameter(v, requires_grad=False) if k in params else v
               for k, v in state.items()}
    artifact = SerializedArtifact(graph, weights, consts, examples)  # type: ignore[arg-type]
    program = deserialize(artifact)
    _check_weights(program, where)
    return program


def _check_weights(program: Any, where: str) -> None:
    """ValueError naming the first weight whose shape or dtype is not the one the graph was
    exported with (torch would run such weights where the operations happen to fit, e.g.
    another MLP's, and predict garbage)."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for spec in program.graph_signature.input_specs:
        tensor = program.state_dict.get(spec.target) if spec.target else None
        node = placeholders.get(getattr(spec.arg, "name", ""))
        want = node.meta.get("val") if node is not None else None
        if tensor is None or want is None:
            continue
        if tuple(tensor.shape) != tuple(want.shape) or tensor.dtype != want.dtype:
            raise ValueError(f"weight {spec.target!r} is {tensor.dtype} {list(tensor.shape)}, "
                             f"but the program in {where} takes {want.dtype} "
                             f"{list(want.shape)}: the weights belong to another model")


def load_program(graph: bytes, constants: bytes, example_inputs: bytes,
                 parameters: Any, state: dict[str, Any], device: Any = "cpu",
                 trusted: bool = False, where: str = GRAPH_FILE) -> Any:
    """The exported program holding ``state`` as a callable torch module in eval mode (it
    was exported so) on ``device``; checked first unless ``trusted`` (deserialize_program)."""
    program = deserialize_program(graph, constants, example_inputs, parameters, state,
                                  trusted, where)
    if str(device) != "cpu":
        try:  # constants made inside the graph move too, not only the weights
            from torch.export.passes import move_to_device_pass
        except ImportError:  # torch < 2.6
            return _module(program).to(device)
        program = move_to_device_pass(program, str(device))
    return _module(program)


def _module(program: Any) -> Any:
    """``program.module()`` without compiling guards into Python (torch >= 2.9 would
    ``exec`` them); its forward pre-hook still refuses inputs of other shapes, as on older
    torch, naming the input and the dimension."""
    import inspect
    if "check_guards" in inspect.signature(program.module).parameters:
        return program.module(check_guards=False)
    return program.module()


def _tensors(data: bytes, empty: Any) -> Any:
    import torch
    return torch.load(io.BytesIO(data), weights_only=True) if data else empty


def _check_tensors(constants: Any, examples: Any, where: str) -> None:
    """The program's constants (tensors by attribute name) and example inputs (a tuple of
    tensors, no keywords), as sparkddl writes them."""
    import torch
    folder = where[:where.rfind("/") + 1]
    if not isinstance(constants, dict) or not all(
            _check.is_dotted(k) and isinstance(v, torch.Tensor) for k, v in constants.items()):
        raise UntrustedProgramError(f"{folder}{CONSTANTS_FILE} holds other than tensors by "
                                    f"attribute name. {TRUST_HINT}")
    if type(examples) is not tuple or examples and not (
            len(examples) == 2 and type(examples[0]) is tuple
            and type(examples[1]) is dict and not examples[1]
            and all(isinstance(x, torch.Tensor) for x in examples[0])):
        raise UntrustedProgramError(f"{folder}{INPUTS_FILE} holds other than a tuple of "
                                    f"tensors. {TRUST_HINT}")


def column(series: Any, shape: Any) -> Any:
    """A feature column (pandas: scalars, or arrays/lists per row) as float32 rows of
    ``shape`` (None: as they come)."""
    import numpy as np
    name = getattr(series, "name", None)
    values = series.to_numpy()
    if values.dtype == object:  # arrays per row (a null scalar is NaN: it predicts NaN)
        rows = [np.asarray(v) for v in values]
        try:
            values = np.stack(rows) if rows else np.zeros((0, 1))
        except ValueError:  # only then look for why: this runs for every batch
            raise ValueError(_unstackable(series, rows)) from None
        if values.dtype == object and series.isna().any():  # every row null: they stacked
            raise ValueError(_unstackable(series, rows))
    return shaped_rows(values, shape, name)


def shaped_rows(values: Any, shape: Any, name: Any) -> Any:
    """``values`` (one row of numbers per row) as contiguous float32 rows of ``shape`` (None:
    as they come); ValueError naming the column where a row holds another count."""
    import numpy as np
    arr = np.ascontiguousarray(values, dtype=np.float32)
    if not shape:
        return arr
    want, got = int(np.prod(shape)), arr.size // max(len(arr), 1)
    if got != want:
        raise ValueError(f"feature column {name!r} has {got} value(s) per row; the model "
                         f"takes {want} (shape {list(shape)}), as it was trained on")
    return arr.reshape((len(arr), *shape))


def _unstackable(series: Any, rows: list[Any]) -> str:
    """Why a feature column's rows do not stack into one array: nulls, or ragged rows."""
    name = getattr(series, "name", None)
    nulls = int(series.isna().sum())
    if nulls:
        return (f"feature column {name!r} has {nulls} null row(s) in a batch of "
                f"{len(series)}; drop or fill them first, e.g. df.na.drop(subset=[{name!r}])")
    shapes = sorted({r.shape for r in rows})
    return (f"feature column {name!r} holds rows of different shapes "
            f"({', '.join(map(str, shapes[:4]))}); every row must have the shape the model "
            "was trained on (pad or trim them)")


def outputs(kind: str, out: Any) -> dict[str, Any]:
    """The model's raw output batch as prediction columns: prediction (class index for
    classifiers), probability and raw (per row) for classifiers."""
    import torch
    if kind == MULTICLASS:
        return {"prediction": out.argmax(-1).double().numpy(),
                "probability": list(torch.softmax(out, -1).double().numpy()),
                "raw": list(out.double().numpy())}
    if kind == BINARY:
        z = out.reshape(-1).double()
        p = torch.sigmoid(z)
        return {"prediction": (z > 0).double().numpy(),
                "probability": list(torch.stack([1 - p, p], 1).numpy()),
                "raw": list(torch.stack([-z, z], 1).numpy())}
    flat = out.reshape(len(out), -1).double()
    if flat.shape[1] == 1:
        return {"prediction": flat[:, 0].numpy()}
    return {"prediction": list(flat.numpy())}


# ---- the MLflow python_function flavor ----

class Predictor:
    """``predict(pandas DataFrame with the feature columns)`` -> a DataFrame with the
    columns TorchModel.transform adds (under the same names)."""

    def __init__(self, folder: str, device: str = "cpu", trusted: bool = False):
        import torch

        def read(name: str) -> bytes:
            with open(os.path.join(folder, name), "rb") as f:
                return f.read()

        self.meta = json.loads(read(META_FILE))
        state = torch.load(io.BytesIO(read(WEIGHTS_FILE)), weights_only=True,
                           map_location="cpu")
        self.device = device
        self.module = load_program(read(GRAPH_FILE), read(CONSTANTS_FILE), read(INPUTS_FILE),
                                   self.meta["parameters"], state, device, trusted,
                                   os.path.join(folder, GRAPH_FILE))

    def predict(self, data: Any, params: Any = None) -> Any:
        import pandas as pd
        import torch
        m = self.meta
        if not isinstance(data, pd.DataFrame):
            data = pd.DataFrame(data)
        missing = [f["name"] for f in m["inputs"] if f["name"] not in data.columns]
        if missing:
            raise ValueError(f"the input has no column {', '.join(map(repr, missing))}; the "
                             f"model takes {', '.join(f['name'] for f in m['inputs'])}")
        inputs = [column(data[f["name"]], f["shape"]) for f in m["inputs"]]
        batch_rows = int((params or {}).get("batch_size", m.get("batch_rows", 1024)))
        results = []
        with torch.no_grad():
            for start in range(0, len(data), batch_rows):
                batch = [torch.from_numpy(x[start:start + batch_rows]).to(self.device)
                         for x in inputs]
                results.append(self.module(*batch).float().cpu())
        out = torch.cat(results) if results else torch.zeros((0, m.get("output_width", 1)))
        cols = outputs(m["task"], out)
        names = m["columns"]  # prediction/probability/raw -> the model's column names
        return pd.DataFrame({names[k]: v for k, v in cols.items()}, index=data.index)


def _load_pyfunc(path: str, model_config: Any = None) -> Predictor:
    """MLflow's entry point (``loader_module``); ``path`` is the model's data folder.
    ``model_config``: ``device``, and ``trusted`` (True: the program is read as it is, for
    files you trust; otherwise what sparkddl never writes is refused with a ValueError)."""
    config = model_config or {}
    return Predictor(path, config.get("device") or "cpu", config.get("trusted") is True)
