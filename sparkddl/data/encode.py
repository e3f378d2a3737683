"""Executor side of materializing: each task of the one write job encodes its partition
(arrays as fixed-width little-endian binary, scalars cast, the split apart) and writes it
with pyarrow in row groups of the same number of rows, reporting its files and the
statistics the driver checks (data/materialize.py)."""
from __future__ import annotations

import contextlib
import json
import posixpath
from typing import Any, Iterator

from sparkddl.data.schema import ColumnSpec
from sparkddl.store import Store
from sparkddl.store.faults import explained

SPLIT_COL = "__split"


def merge_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Statistics of two parts of the data: counts add up, ``lo:``/``hi:`` keys keep the
    minimum/maximum."""
    for k, v in b.items():
        if k not in a:
            a[k] = v
        elif k.startswith("lo:"):
            a[k] = min(a[k], v)
        elif k.startswith("hi:"):
            a[k] = max(a[k], v)
        else:
            a[k] += v
    return a


def write_partition(columns: tuple[ColumnSpec, ...], store: Store, root: str, group_rows: int,
                    batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow, on an executor: encode one partition (:func:`encode_batch`), write its
    training and validation rows to a Parquet file each, in row groups of ``group_rows``,
    and yield one report row per file (plus one carrying the statistics)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark import TaskContext

    ctx = TaskContext.get()  # in a task: never None
    name = f"part-{ctx.partitionId():05d}-{ctx.attemptNumber()}.parquet"  # pyright: ignore[reportOptionalMemberAccess]
    fs = store.filesystem()
    schema = pa.schema([(c.name, arrow_type(c)) for c in columns])
    plain = [c.name for c in columns if c.encoding != "tensor"]
    writers: dict[str, Any] = {}
    pending: dict[str, list[Any]] = {"train": [], "val": []}
    sums: dict[str, Any] = {}

    urls = {split: f"{root}/{SPLIT_COL}={split}/{name}" for split in pending}

    def flush(split: str, everything: bool) -> None:
        rows = sum(b.num_rows for b in pending[split])
        whole = rows if everything else rows - rows % group_rows
        if not whole:
            return
        table = pa.Table.from_batches(pending[split], schema)
        with explained(urls[split]):  # a full disk: the file, its fault and the space left
            if split not in writers:
                path = store.fs_path(urls[split])
                fs.create_dir(posixpath.dirname(path), recursive=True)
                # given the path, the writer owns its file and closes it (an object store
                # completes the upload only then)
                writers[split] = pq.ParquetWriter(path, schema, filesystem=fs,
                                                  # (pyright infers bool; a list is allowed)
                                                  use_dictionary=plain, write_statistics=plain)  # pyright: ignore[reportArgumentType]
            writers[split].write_table(table.slice(0, whole), row_group_size=group_rows)
        pending[split] = table.slice(whole).to_batches()

    try:
        for whole in batches:
            batch_sums, parts = encode_batch(columns, schema, whole)
            sums = merge_stats(sums, batch_sums)
            for split, part in parts.items():
                pending[split].append(part)
                if sum(b.num_rows for b in pending[split]) >= group_rows:
                    flush(split, everything=False)
        for split in pending:
            flush(split, everything=True)
        for split, writer in writers.items():
            with explained(urls[split]):  # the footer, and an object store's upload
                writer.close()
    except BaseException:
        _abandon(store, writers, urls)
        raise
    reports = [(split, urls[split]) for split in writers]
    yield pa.RecordBatch.from_pydict({
        "split": [s for s, _ in reports] + [""], "path": [p for _, p in reports] + [""],
        "stats": [json.dumps({})] * len(reports) + [json.dumps(sums)]})


def _abandon(store: Store, writers: dict[str, Any], urls: dict[str, str]) -> None:
    """Close and delete what a failed task attempt wrote: its partial files would hold the
    space its retry needs (the driver removes the whole write's folder too, but only once
    the job has failed)."""
    for writer in writers.values():
        with contextlib.suppress(Exception):  # closing writes a footer: it may fail again
            writer.close()
    for url in urls.values():  # a file may exist without its writer
        store.discard(url)


def arrow_type(c: ColumnSpec) -> Any:
    """How a column is stored in the materialized Parquet."""
    import numpy as np
    import pyarrow as pa
    if c.encoding in ("tensor", "binary"):
        return pa.binary()
    if c.encoding == "string":
        return pa.string()
    if c.encoding == "varlist":
        return pa.list_(pa.from_numpy_dtype(np.dtype(c.dtype)))
    return pa.from_numpy_dtype(np.dtype(c.dtype))


def encode_batch(columns: tuple[ColumnSpec, ...], schema: Any, batch: Any
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One Arrow batch -> (its statistics, its rows encoded by split: arrays as fixed-width
    little-endian binary, scalars cast). The statistics are what the driver checks: rows,
    validation rows, nulls, array lengths and null elements, the range of integral labels.
    A batch with rows that cannot be encoded (nulls, arrays of another length) yields no rows,
    as the driver refuses the data when it sees the statistics."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute

    # pyarrow makes these functions (pc.equal, pc.sum, ...) at import time: pyright cannot see them
    pc: Any = pyarrow.compute
    sums: dict[str, Any] = {"rows": batch.num_rows}
    split = batch.column(SPLIT_COL)
    is_val = pc.equal(split, 1)
    sums["val_rows"] = pc.sum(is_val).as_py() or 0
    sums["bad_split"] = batch.num_rows - (pc.sum(pc.is_in(
        split, value_set=pa.array([0, 1], split.type))).as_py() or 0)
    arrays, encodable = [], True
    for c in columns:
        col = batch.column(c.name)
        sums[f"nulls:{c.name}"] = col.null_count
        encodable &= not col.null_count
        if c.encoding == "tensor":
            if len(col):
                lo, hi = pc.min_max(pc.list_value_length(col).fill_null(c.width)).values()
                sums[f"lo:len:{c.name}"], sums[f"hi:len:{c.name}"] = lo.as_py(), hi.as_py()
                encodable &= lo.as_py() == hi.as_py() == c.width
            flat = col.flatten()
            sums[f"elements:{c.name}"] = flat.null_count
            encodable &= not flat.null_count
            if not encodable:
                continue
            raw = np.ascontiguousarray(flat.to_numpy(zero_copy_only=False),
                                       dtype=np.dtype(c.dtype).newbyteorder("<"))
            offsets = np.arange(0, (len(col) + 1) * c.nbytes, c.nbytes, dtype=np.int32)
            col = pa.Array.from_buffers(pa.binary(), len(col),
                                        [None, pa.py_buffer(offsets), pa.py_buffer(raw)])
        elif c.raw:  # as it is: the transformFn reads it
            if c.encoding == "varlist" and len(col):
                lengths = pc.list_value_length(col).fill_null(0)
                lo, hi = pc.min_max(lengths).values()
                sums[f"lo:len:{c.name}"], sums[f"hi:len:{c.name}"] = lo.as_py(), hi.as_py()
                flat = col.flatten()
                sums[f"elements:{c.name}"] = flat.null_count
                encodable &= not flat.null_count
            col = col.cast(arrow_type(c))
        else:
            if c.role == "label" and c.dtype == "int64" and col.null_count < len(col):
                lo, hi = pc.min_max(col).values()
                sums[f"lo:label:{c.name}"], sums[f"hi:label:{c.name}"] = lo.as_py(), hi.as_py()
            col = col.cast(pa.from_numpy_dtype(np.dtype(c.dtype)))
        arrays.append(col)
    if not encodable or sums["bad_split"]:
        sums["bad_rows"] = batch.num_rows
        return sums, {}
    encoded = pa.RecordBatch.from_arrays(arrays, schema=schema)
    if not sums["val_rows"]:
        return sums, {"train": encoded}
    if sums["val_rows"] == batch.num_rows:
        return sums, {"val": encoded}
    return sums, {"train": encoded.filter(pc.invert(is_val)), "val": encoded.filter(is_val)}
