"""Executor side of TorchModel.transform: batched forward passes in a pandas UDF, with the
model loaded once per Python worker."""
from __future__ import annotations

import hashlib
import io
import threading
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pandas as pd  # module level: pandas_udf resolves the type hints below against it

from sparkddl.problems import Problem

_models: dict[str, Any] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class Inline:
    """Stands in for a Broadcast where there are none (Spark Connect): ``.value`` travels
    with the function that holds it."""

    value: Any


@dataclass(frozen=True)
class ModelPayload:
    """Architecture (import description or pickled factory) and weights, as bytes."""

    architecture: dict[str, Any]
    pickled_factory: bytes
    weights: bytes

    @property
    def key(self) -> str:
        h = hashlib.sha256(self.weights)
        h.update(self.pickled_factory)
        h.update(repr(sorted(self.architecture.items())).encode())
        return h.hexdigest()

    def module(self) -> Any:
        """The model in eval mode; built once per worker process and cached."""
        import torch
        key = self.key
        with _lock:
            if key not in _models:
                from sparkddl.ml.architecture import rebuild, trusted_loading
                with trusted_loading():  # our own fitted model, shipped by this application
                    module = rebuild(self.architecture, lambda: self.pickled_factory,
                                     "the driver")
                module.load_state_dict(torch.load(io.BytesIO(self.weights), weights_only=True))
                _models.clear()  # keep one model per worker: the latest one used
                _models[key] = module.eval()
            return _models[key]


def udf_function(payload_bc: Any, features: list[str], kind: str, batch_rows: int,
                 shapes: dict[str, list[int]]) -> Any:
    """The typed iterator function pandas_udf expects (Spark reads its type hints)."""
    def predict(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        yield from predict_batches(payload_bc, features, kind, batch_rows, shapes, frames)
    return predict


def predict_batches(payload_bc: Any, features: list[str], kind: str, batch_rows: int,
                    shapes: dict[str, list[int]], frames: Iterator[Any]) -> Iterator[Any]:
    """pandas UDF body: struct of feature columns in, struct of prediction columns out."""
    import torch
    from pyspark import TaskContext

    ctx = TaskContext.get()
    saved = torch.get_num_threads()  # the Python worker outlives this task
    if ctx is not None:
        torch.set_num_threads(max(1, int(ctx.cpus())))
    try:
        yield from _predict_frames(payload_bc.value.module(), features, kind, batch_rows, shapes,
                                   frames)
    finally:
        torch.set_num_threads(saved)


def _predict_frames(module: Any, features: list[str], kind: str, batch_rows: int,
                    shapes: dict[str, list[int]], frames: Iterator[Any]) -> Iterator[Any]:
    import torch
    for frame in frames:
        inputs = [_column(frame[f], shapes.get(f)) for f in features]
        outputs = []
        with torch.no_grad():
            for start in range(0, len(frame), batch_rows):
                outputs.append(module(*[torch.from_numpy(x[start:start + batch_rows])
                                        for x in inputs]).float())
        out = torch.cat(outputs) if outputs else torch.zeros(0)
        yield pd.DataFrame(_columns_for(kind, out))


def _column(series: Any, shape: list[int] | None) -> np.ndarray:
    values = series.to_numpy()
    if values.dtype == object:
        values = np.stack(values) if len(values) else np.zeros((0, 1))
    arr = np.ascontiguousarray(values, dtype=np.float32)
    return arr.reshape((len(arr), *shape)) if shape else arr


def _columns_for(kind: str, out: Any) -> dict[str, Any]:
    import torch
    if kind == Problem.MULTICLASS:
        return {"prediction": out.argmax(-1).double().numpy(),
                "probability": list(torch.softmax(out, -1).double().numpy()),
                "raw": list(out.double().numpy())}
    if kind == Problem.BINARY:
        z = out.reshape(-1).double()
        p = torch.sigmoid(z)
        return {"prediction": (z > 0).double().numpy(),
                "probability": list(torch.stack([1 - p, p], 1).numpy()),
                "raw": list(torch.stack([-z, z], 1).numpy())}
    flat = out.reshape(len(out), -1).double()
    if flat.shape[1] == 1:
        return {"prediction": flat[:, 0].numpy()}
    return {"prediction": list(flat.numpy())}
