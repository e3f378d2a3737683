"""Row groups in, fixed-size shuffled batches out: decoding and the shuffle buffer.

Readers hand this module one row group at a time as Arrow columns; they are decoded into
numpy without per-row Python objects and re-cut into batches of exactly ``batch_size``
(but the last one, where an evaluation asks for every row).
"""
from __future__ import annotations

import warnings
from typing import Any, Iterator

import numpy as np

from sparkddl.data.schema import ColumnSpec
from sparkddl.errors import DataError

Chunk = dict[str, np.ndarray]


def decode_arrow(col: ColumnSpec, values: Any) -> np.ndarray:
    """One column of one row group (a pyarrow Array or ChunkedArray) -> ``[n, *shape]`` array
    of ``col.dtype``, zero-copy where the layout allows."""
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):  # one chunk: use it as is (combining copies)
        arr = values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    else:
        arr = values
    n = len(arr)
    if arr.null_count:
        raise DataError(f"column {col.name!r} has {arr.null_count} null values in a row group; "
                        "drop or fill them first")
    if col.encoding == "tensor":
        return decode_tensor(col, _tensor_bytes(col, arr), n)
    if col.encoding in ("binary", "string"):  # bytes / str objects: the transformFn's input
        return arr.to_numpy(zero_copy_only=False)
    if col.encoding == "varlist":
        return decode_varlist(col, arr)
    if col.encoding == "list":
        step = value_counts(arr)
        if len(step) and (step.min() != col.width or step.max() != col.width):
            raise DataError(f"column {col.name!r} holds arrays of unequal length "
                            f"{sorted(set(step.tolist()))[:10]}; every row needs {col.width} "
                            "values")
        flat = arr.flatten().to_numpy(zero_copy_only=False)
        return flat.astype(col.dtype, copy=False).reshape((n, *col.shape))
    return arr.to_numpy(zero_copy_only=False).astype(col.dtype, copy=False).reshape(
        (n, *col.shape))


def decode_varlist(col: ColumnSpec, arr: Any) -> np.ndarray:
    """Arrays of varying length -> an object array of 1-D ``col.dtype`` arrays, views of one
    flat buffer."""
    values = arr.flatten()
    if values.null_count:
        raise DataError(f"column {col.name!r} has {values.null_count} null elements inside its "
                        "arrays in a row group; fill or drop them first")
    flat = values.to_numpy(zero_copy_only=False).astype(col.dtype, copy=False)
    offsets = _raw_offsets(arr) if not _is_fixed(arr) else \
        np.arange(len(arr) + 1) * arr.type.list_size
    offsets = offsets - offsets[0]
    return object_rows([flat[offsets[i]:offsets[i + 1]] for i in range(len(arr))])


def object_rows(rows: list[np.ndarray]) -> np.ndarray:
    """Arrays of their own lengths as one object array (``np.array`` would try to stack
    them, and fails or makes a 2-D array when their lengths happen to agree)."""
    out = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        out[i] = row
    return out


def _is_fixed(arr: Any) -> bool:
    import pyarrow as pa
    return pa.types.is_fixed_size_list(arr.type)


def decode_tensor(col: ColumnSpec, raw: Any, n: int) -> np.ndarray:
    """``n`` rows of raw little-endian values -> ``[n, *shape]`` (a view, no copy)."""
    values = np.frombuffer(raw, dtype=np.dtype(col.dtype).newbyteorder("<"))
    return values.astype(col.dtype, copy=False).reshape((n, *col.shape))


def _raw_offsets(arr: Any) -> np.ndarray:
    """The n+1 value offsets of a (large) binary or list array, honouring its slice offset."""
    import pyarrow as pa
    wide = pa.types.is_large_binary(arr.type) or pa.types.is_large_list(arr.type)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if wide else np.int32)
    return offsets[arr.offset:arr.offset + len(arr) + 1]


def value_counts(arr: Any) -> np.ndarray:
    """Per-row value counts."""
    import pyarrow as pa
    if pa.types.is_fixed_size_list(arr.type):
        return np.full(len(arr), arr.type.list_size)
    return np.diff(_raw_offsets(arr))


def _tensor_bytes(col: ColumnSpec, arr: Any) -> memoryview:
    import pyarrow as pa
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        raise DataError(f"column {col.name!r} should hold raw tensor bytes but is {arr.type}")
    lengths = value_counts(arr)
    if len(lengths) and (lengths.min() != col.nbytes or lengths.max() != col.nbytes):
        raise DataError(f"column {col.name!r}: rows of {sorted(set(lengths.tolist()))[:5]} bytes, "
                        f"expected {col.nbytes} bytes per row ({col.dtype} {col.shape})")
    if not len(arr):
        return memoryview(b"")
    start = int(_raw_offsets(arr)[0])
    return memoryview(arr.buffers()[2])[start:start + len(arr) * col.nbytes]


class Rebatcher:
    """Turns a stream of chunks into batches of exactly ``batch_size`` rows, copying each row
    once: from the chunk it was decoded into (often a view of Arrow's buffers) into its
    batch.

    Rows are not moved until they go into a batch: the pool is two index arrays (which chunk,
    which row), and ``add(chunk, rows)`` appends the chunk's ``rows`` (in that order; None:
    all, in order). With ``buffer_rows > 0`` rows pass through a shuffle buffer: once it
    holds more than ``buffer_rows`` rows, a random half of it (seeded) is emitted as batches
    and the rest stays to mix with later chunks. Without one, batches follow the order
    given. A batch is gathered straight into a new array (``np.take``), or is a slice of
    its chunk where its rows are consecutive there. ``finish`` shuffles and emits what is
    left; the final partial batch is dropped, or emitted last with ``partial_last``. Chunks
    are released once no pending row points into them; when more than ``MAX_LIVE`` are held
    (rows left behind by the buffer), the pending rows of all but the newest are copied into
    one.
    """

    MAX_LIVE = 3

    def __init__(self, batch_size: int, buffer_rows: int, rng: np.random.Generator,
                 private: bool = False, partial_last: bool = False):
        self.batch_size = batch_size
        self.partial_last = partial_last
        self.buffer_rows = buffer_rows
        self.rng = rng
        # batches never share memory with the chunks (the epoch cache's, which later
        # epochs hand over again): no view, and arrays of rows (ragged columns) copied
        self.private = private
        self._chunks: dict[int, Chunk] = {}
        self._next = 0
        self._cid = np.empty(0, dtype=np.int64)  # pending rows: their chunk...
        self._row = np.empty(0, dtype=np.int64)  # ...and their row in it

    @property
    def pending(self) -> int:
        return len(self._cid)

    def add(self, chunk: Chunk, rows: np.ndarray | None = None) -> Iterator[Chunk]:
        n = len(next(iter(chunk.values()))) if rows is None else len(rows)
        if n == 0:
            return
        cid, self._next = self._next, self._next + 1
        self._chunks[cid] = chunk
        self._cid = np.concatenate([self._cid, np.full(n, cid, dtype=np.int64)])
        self._row = np.concatenate([self._row, np.arange(n, dtype=np.int64) if rows is None
                                    else np.asarray(rows, dtype=np.int64)])
        threshold = self.buffer_rows + self.batch_size if self.buffer_rows else self.batch_size
        if self.pending >= threshold:
            yield from self._emit(keep=self.buffer_rows // 2 if self.buffer_rows else 0)

    def finish(self) -> Iterator[Chunk]:
        if self.pending >= self.batch_size:
            yield from self._emit(keep=0)
        if self.partial_last and self.pending:  # fewer than batch_size rows, shuffled or not
            yield self._gather(self._cid, self._row)
        self._chunks.clear()
        self._cid, self._row = self._cid[:0], self._row[:0]

    def _emit(self, keep: int) -> Iterator[Chunk]:
        n, b = self.pending, self.batch_size
        k = max((n - keep) // b, 0)
        cid, row = self._cid, self._row
        if self.buffer_rows:
            order = self.rng.permutation(n)
            cid, row = cid[order], row[order]
        self._cid, self._row = cid[k * b:], row[k * b:]
        for i in range(k):
            yield self._gather(cid[i * b:(i + 1) * b], row[i * b:(i + 1) * b])
        self._release()

    def _gather(self, cid: np.ndarray, row: np.ndarray) -> Chunk:
        out = self._gathered(cid, row)
        if self.private:
            for k, v in out.items():
                if v.dtype == object:  # ragged rows: arrays of their own
                    rows = np.empty(len(v), dtype=object)
                    rows[:] = [x.copy() if isinstance(x, np.ndarray) else x for x in v]
                    out[k] = rows
        return out

    def _gathered(self, cid: np.ndarray, row: np.ndarray) -> Chunk:
        if cid[0] == cid[-1] and (cid == cid[0]).all():
            src = self._chunks[int(cid[0])]
            if row[-1] - row[0] == len(row) - 1 and (np.diff(row) == 1).all():
                if self.private:
                    return {k: v[row[0]:row[-1] + 1].copy() for k, v in src.items()}
                return {k: v[row[0]:row[-1] + 1] for k, v in src.items()}  # a view
            return {k: v.take(row, axis=0) for k, v in src.items()}
        order = np.argsort(cid, kind="stable")  # one take per chunk, into the batch itself
        cid, row = cid[order], row[order]
        cuts = [0, *(np.flatnonzero(np.diff(cid)) + 1).tolist(), len(cid)]
        first = self._chunks[int(cid[0])]
        out = {k: np.empty((len(row), *v.shape[1:]), dtype=v.dtype) for k, v in first.items()}
        for start, end in zip(cuts[:-1], cuts[1:]):
            src = self._chunks[int(cid[start])]
            for k, v in src.items():
                np.take(v, row[start:end], axis=0, out=out[k][start:end])
        return out

    def _release(self) -> None:
        live = set(np.unique(self._cid).tolist())
        for cid in [c for c in self._chunks if c not in live]:
            del self._chunks[cid]
        if len(self._chunks) <= self.MAX_LIVE:
            return
        newest = max(self._chunks)
        old = self._cid != newest
        merged = self._gather(self._cid[old], self._row[old])  # rows the buffer kept
        merged_id, self._next = self._next, self._next + 1
        for cid in [c for c in self._chunks if c != newest]:
            del self._chunks[cid]
        self._chunks[merged_id] = merged
        # _gather grouped the rows by chunk: give them their new places in that order
        order = np.argsort(self._cid[old], kind="stable")
        rows = np.empty(len(order), dtype=np.int64)
        rows[order] = np.arange(len(order))
        self._cid = np.where(old, merged_id, self._cid)
        self._row = self._row.copy()
        self._row[old] = rows


def _concat(chunks: list[Chunk]) -> Chunk:
    if len(chunks) == 1:
        return chunks[0]
    return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}


def to_tensors(batch: Chunk) -> dict[str, Any]:
    import torch
    out = {}
    for name, arr in batch.items():
        arr = np.ascontiguousarray(arr)
        if not arr.flags.writeable:
            # a view of Arrow memory (numpy marks it read-only), shared with torch without a
            # copy, so an in-place op on the tensor writes into the Arrow buffer. That is
            # harmless: the buffer is heap memory (no reader memory-maps files), freshly read
            # for this epoch, each batch views only its own rows of it, and no one reads
            # those rows again (the epoch cache's rows are never viewed: Rebatcher.private).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                out[name] = torch.from_numpy(arr)
        else:
            out[name] = torch.from_numpy(arr)
    return out
