"""``transformFn``: the user's function from a batch of raw columns to tensors.

``fn(batch) -> dict of tensors``: ``batch`` maps every column of the batch to a numpy array;
binary and string columns are object arrays of ``bytes``/``str``, and a variable-length
array column is a list of 1-D arrays. What ``fn`` returns replaces or adds columns; numeric
columns it does not return (labels, weights) pass through. The shapes it returns must be the
same for every batch (the batch dimension aside): a :class:`~sparkddl.errors.TransformError`
names the column and the shapes seen otherwise, and one when ``fn`` raises names the rank,
epoch and batch. The same function runs on the ranks (in the reader's threads, ahead of the
training loop), on the driver (the sample check, snapshot evaluation) and in
``TorchModel.transform`` before the forward pass.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

import numpy as np

from sparkddl.errors import TransformError

Transform = Callable[[dict[str, Any]], dict[str, Any]]


def raw_view(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """What ``fn`` sees: variable-length columns (object arrays of arrays) as lists."""
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if v.dtype == object and len(v) and isinstance(v[0], np.ndarray):
            out[k] = list(v)
        else:
            out[k] = v
    return out


class Shapes:
    """The per-row shape and dtype of each output column, as on the driver's sample (or
    the first batch); later batches must match (thread-safe: reader threads check
    concurrently)."""

    def __init__(self, known: Any = ()) -> None:
        self.seen: dict[str, tuple[tuple[int, ...], str]] = {
            k: (tuple(shape), str(dtype)) for k, shape, dtype in known}
        self._lock = threading.Lock()

    def record(self) -> tuple[tuple[str, tuple[int, ...], str], ...]:
        with self._lock:
            return tuple((k, shape, dtype) for k, (shape, dtype) in sorted(self.seen.items()))

    def check(self, out: dict[str, Any], rows: int, where: str) -> None:
        for k, t in out.items():
            shape, dtype = tuple(t.shape[1:]), str(t.dtype).replace("torch.", "")
            if not len(t.shape) or t.shape[0] != rows:
                raise TransformError(f"transformFn returned {k!r} with shape {tuple(t.shape)} "
                                     f"for a batch of {rows} rows ({where}); its first "
                                     "dimension must be the batch")
            with self._lock:
                first = self.seen.setdefault(k, (shape, dtype))
            if first != (shape, dtype):
                raise TransformError(
                    f"transformFn returned {k!r} as {dtype} rows of shape {shape} ({where}), "
                    f"but {first[1]} rows of shape {first[0]} before (the driver's sample or "
                    "an earlier batch); batch "
                    "shapes after the transform must be fixed (pad or crop inside it)")


def apply(fn: Transform, batch: dict[str, np.ndarray], where: str,
          shapes: Shapes | None = None) -> dict[str, Any]:
    """``batch`` (numpy, as decoded) through ``fn``: a dict of torch tensors, the numeric
    columns ``fn`` did not return included."""
    import torch
    rows = len(next(iter(batch.values()))) if batch else 0
    try:
        result = fn(raw_view(batch))
    except TransformError:
        raise
    except Exception as exc:
        raise TransformError(f"transformFn failed on {where}: {type(exc).__name__}: "
                             f"{exc}") from exc
    if not isinstance(result, dict):
        raise TransformError(f"transformFn must return a dict of column -> tensor, got "
                             f"{type(result).__name__} ({where})")
    out: dict[str, Any] = {}
    for k, v in result.items():
        try:
            out[k] = v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))
        except (TypeError, ValueError) as exc:
            raise TransformError(f"transformFn returned {k!r} as {type(v).__name__}, which is "
                                 f"not a tensor or a numeric array ({where}): {exc}") from exc
    if shapes is not None:
        shapes.check(out, rows, where)
    from sparkddl.data.batching import to_tensors
    rest = {k: v for k, v in batch.items() if k not in out and v.dtype != object}
    return {**to_tensors(rest), **out}


def ahead(fn: Transform, batches: Iterator[dict[str, np.ndarray]], workers: int,
          where: Callable[[int], str], shapes: Shapes) -> Iterator[dict[str, Any]]:
    """``batches`` through ``fn`` on ``workers`` threads, up to ``2 * workers`` batches ahead
    of the consumer, in order."""
    pending: list[Future] = []
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="sparkddl-transform") as pool:
        try:
            for i, batch in enumerate(batches):
                pending.append(pool.submit(apply, fn, batch, where(i), shapes))
                if len(pending) > 2 * max(1, workers):
                    yield pending.pop(0).result()
            while pending:
                yield pending.pop(0).result()
        finally:
            for f in pending:
                f.cancel()
