"""Executor side of TorchModel.transform: batched forward passes in a pandas UDF, with the
model loaded once per Python worker."""
from __future__ import annotations

import functools
import hashlib
import threading
from dataclasses import dataclass
from typing import Any, Iterator

import pandas as pd  # module level: pandas_udf resolves the type hints below against it

from sparkddl.checkpoint.safe import load_plain
from sparkddl.errors import ConfigError
from sparkddl.export.portable import column, outputs

_models: dict[str, Any] = {}
_lock = threading.Lock()


class _Kept:
    """The kept model's standing with the collector (:mod:`sparkddl.task.frozen`): the task
    attempt that built it, and whether it has been frozen since."""

    built_in: Any = None
    frozen = False


@dataclass(frozen=True)
class ModelPayload:
    """Architecture (import description, pickled factory or torch.export program) and
    weights, as bytes."""

    architecture: dict[str, Any]
    pickled_factory: bytes
    weights: bytes
    program: Any = None  # sparkddl.export.program.Program: run it, no model code needed
    transform: bytes = b""  # the pickled transformFn (the application's own), if any
    # feature column -> how training decoded it (ColumnSpec JSON), for the transformFn's input
    columns: Any = None

    @functools.cached_property
    def key(self) -> str:
        """The model's identity, hashed once per process (not per batch: the weights and a
        program's graph are megabytes)."""
        h = hashlib.sha256(self.weights)
        h.update(self.pickled_factory)
        if self.program is not None:
            h.update(self.program.graph)
        h.update(repr(sorted(self.architecture.items())).encode())
        return h.hexdigest()

    def module(self, device: Any = "cpu") -> Any:
        """The model in eval mode on ``device``; built once per worker process and cached."""
        key = f"{self.key}@{device}"
        with _lock:
            if key not in _models:
                _models.clear()  # one model per worker: the latest one used
                if _Kept.frozen:  # the one kept before, frozen: the collector may free it
                    from sparkddl.task.frozen import thaw
                    thaw()
                    _Kept.frozen = False
                state = load_plain(self.weights, "the model's weights shipped by the driver")
                if self.program is not None:
                    from sparkddl.export.program import load
                    module = checked_once_per_shape(load(self.program, state, device))
                else:
                    from sparkddl.ml.architecture import rebuild, trusted_loading
                    with trusted_loading():  # our own fitted model, shipped by this application
                        module = rebuild(self.architecture, lambda: self.pickled_factory,
                                         "the driver")
                    module.load_state_dict(state)
                    module.to(device)
                _models[key] = exported_eval(module)
                _Kept.built_in = task_attempt()
            return _models[key]


def task_attempt() -> Any:
    """This task's attempt id (None outside a Spark task)."""
    from pyspark import TaskContext
    ctx = TaskContext.get()
    return ctx.taskAttemptId() if ctx is not None else None


def settle() -> None:
    """At a scoring task's start, before anything of the user's is unpickled: where this
    worker keeps a model that an earlier task built (and ran: what its first pass imported
    is loaded too), freeze what is alive (:mod:`sparkddl.task.frozen`), the imports and that
    model, out of the full collection pyspark runs after every task. Not in the task that
    built it, so a task that goes from model to model freezes none of them."""
    if _models and not _Kept.frozen:
        with _lock:
            if _models and not _Kept.frozen and _Kept.built_in != task_attempt():
                from sparkddl.task.frozen import freeze
                freeze()
                _Kept.frozen = True


def raw_column(series: Any, spec: dict[str, Any] | None = None) -> Any:
    """A feature column as the transformFn saw it in training (``spec``: the column as
    training decoded it): bytes/str as object arrays, ragged arrays as an object array of
    arrays of their dtype, numbers float32 shaped as declared."""
    import numpy as np

    from sparkddl.data.batching import object_rows
    spec = spec or {}
    values = series.to_numpy()
    if spec.get("encoding") in ("binary", "string") or (
            values.dtype == object and len(values) and isinstance(values[0], (bytes, str))):
        return values
    if spec.get("encoding") == "varlist":
        return object_rows([np.asarray(v, dtype=spec.get("dtype", "float32")) for v in values])
    return column(series, spec.get("shape") or None)


def checked_once_per_shape(module: Any) -> Any:
    """A torch.export module whose input check (a forward pre-hook of torch's that walks
    every input's dimensions against the program's constraints) runs once per set of input
    shapes, not at every call: the check reads the inputs' shapes and nothing else, and a
    scoring task sends batches of one shape (at 1,024-row batches the check was 5-6 % of the
    Python workers' CPU). Inputs other than tensors are checked at every call, as before."""
    hooks = getattr(module, "_forward_pre_hooks", None)
    if not hooks:
        return module
    for hook_id, hook in list(hooks.items()):
        if getattr(hook, "__name__", "") == "_check_input_constraints_pre_hook":
            hooks[hook_id] = _once_per_shape(hook)
    return module


def _once_per_shape(check: Any) -> Any:
    import torch
    passed: set[Any] = set()

    def once(module: Any, args: Any, kwargs: Any) -> Any:
        values = [*args, *kwargs.values()] if kwargs else list(args)
        if not all(isinstance(v, torch.Tensor) for v in values):
            return check(module, args, kwargs)
        key = (tuple((tuple(v.shape), v.dtype) for v in values), tuple(kwargs or ()))
        if key not in passed:
            check(module, args, kwargs)  # raises where the shapes do not fit the program
            passed.add(key)
        return None
    return once


def exported_eval(module: Any) -> Any:
    """``module`` in eval mode; a torch.export program was exported in eval mode already, and
    (torch >= 2.9) refuses ``eval()``."""
    try:
        return module.eval()
    except NotImplementedError:
        return module


DEVICES = ("auto", "cpu", "cuda")


def check_device(choice: str) -> None:
    """On the driver, before any task runs."""
    if choice not in DEVICES:
        raise ConfigError(f"unknown inferenceDevice {choice!r}; choose one of "
                          f"{', '.join(DEVICES)}")


def resolve_device(choice: str, trained_on_gpu: bool, cuda_available: bool,
                   gpus: list[str], visible_at_init: str | None = None) -> str:
    """Where this task runs the model: ``cuda:<i>`` (the task's Spark-assigned GPU, else the
    first) or ``cpu``. "auto" picks CUDA only for models trained with useGpu.
    ``visible_at_init``: CUDA_VISIBLE_DEVICES when a training task of this reused worker
    initialized CUDA (devices are numbered as it saw them), else None (all are visible)."""
    if choice == "cuda" and not cuda_available:
        import socket
        raise ConfigError(
            f"inferenceDevice='cuda' but torch on executor {socket.gethostname()} sees no "
            "GPU; use inferenceDevice='auto' or 'cpu', or run transform on GPU executors")
    if choice == "cpu" or not cuda_available or (choice == "auto" and not trained_on_gpu):
        return "cpu"
    if not gpus:
        return "cuda:0"
    if visible_at_init is not None:
        from sparkddl.task.dist import device_index
        return f"cuda:{device_index(gpus[0], True, visible_at_init)}"
    return f"cuda:{int(gpus[0]) if gpus[0].isdigit() else 0}"


def udf_function(payload_bc: Any, features: list[str], kind: str, batch_rows: int,
                 shapes: dict[str, list[int]], device: str = "cpu",
                 trained_on_gpu: bool = False) -> Any:
    """The typed iterator function pandas_udf expects (Spark reads its type hints)."""
    def predict(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        yield from predict_batches(payload_bc, features, kind, batch_rows, shapes, frames,
                                   device, trained_on_gpu)
    return predict


def task_device(device: str, trained_on_gpu: bool) -> tuple[str, int]:
    """Where this task runs the model (:func:`resolve_device` with the task's GPUs) and how
    many torch threads it uses (the task's CPUs; every core outside a task)."""
    import torch
    from pyspark import TaskContext

    from sparkddl.task.dist import visible_at_cuda_init
    ctx = TaskContext.get()
    gpus = list(ctx.resources()["gpu"].addresses) if ctx is not None and \
        "gpu" in ctx.resources() else []
    where = resolve_device(device, trained_on_gpu, torch.cuda.is_available(), gpus,
                           visible_at_cuda_init())
    return where, max(1, int(ctx.cpus())) if ctx is not None else torch.get_num_threads()


def predict_batches(payload_bc: Any, features: list[str], kind: str, batch_rows: int,
                    shapes: dict[str, list[int]], frames: Iterator[Any], device: str = "cpu",
                    trained_on_gpu: bool = False) -> Iterator[Any]:
    """pandas UDF body: struct of feature columns in, struct of prediction columns out."""
    import torch
    from pyspark import TaskContext

    from sparkddl.task.archives import keep_spark_archives
    keep_spark_archives()  # the worker's next tasks start ~0.1 s sooner

    ctx = TaskContext.get()
    gpus = list(ctx.resources()["gpu"].addresses) if ctx is not None and \
        "gpu" in ctx.resources() else []
    from sparkddl.task.dist import visible_at_cuda_init
    where = resolve_device(device, trained_on_gpu, torch.cuda.is_available(), gpus,
                           visible_at_cuda_init())
    saved = torch.get_num_threads()  # the Python worker outlives this task
    if ctx is not None:
        torch.set_num_threads(max(1, int(ctx.cpus())))
    try:
        settle()  # before the transformFn is unpickled
        payload = payload_bc.value
        transform = None
        if payload.transform:
            from pyspark import cloudpickle
            transform = cloudpickle.loads(payload.transform)  # shipped by this application
        yield from _predict_frames(payload.module(where), features, kind, batch_rows,
                                   shapes, frames, where, transform, payload.columns)
    finally:
        torch.set_num_threads(saved)


def _predict_frames(module: Any, features: list[str], kind: str, batch_rows: int,
                    shapes: dict[str, list[int]], frames: Iterator[Any],
                    device: str = "cpu", transform: Any = None,
                    columns: dict[str, Any] | None = None) -> Iterator[Any]:
    """Batches of ``batch_rows`` through the transformFn (if any) and the model; on CUDA
    each batch is copied from pinned memory without blocking, and the outputs come back
    once per frame."""
    import torch

    from sparkddl.data.transform import apply
    cuda = device.startswith("cuda")
    for frame in frames:
        inputs = [raw_column(frame[f], (columns or {}).get(f)) if transform is not None else
                  column(frame[f], shapes.get(f)) for f in features]
        results = []
        with torch.no_grad():
            for start in range(0, len(frame), batch_rows):
                if transform is not None:
                    out = apply(transform, {f: x[start:start + batch_rows]
                                            for f, x in zip(features, inputs)},
                                f"TorchModel.transform, rows {start}+ of a batch")
                    batch = [out[f] for f in features]  # as in training: its dtypes
                else:
                    batch = [torch.from_numpy(x[start:start + batch_rows]) for x in inputs]
                if cuda:
                    batch = [t.pin_memory().to(device, non_blocking=True) for t in batch]
                results.append(module(*batch).float())
        out = torch.cat(results).cpu() if results else torch.zeros(0)
        yield pd.DataFrame(outputs(kind, out))
