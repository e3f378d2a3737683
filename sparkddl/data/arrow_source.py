"""The pieces of a sub-shard read with pyarrow alone: the reader for stacks where
Petastorm cannot load (pyarrow >= 15, numpy 2, Spark >= 4.1), and for tables read in place
with a split, files named one by one or another writer's types.

The row groups are those of :func:`list_row_groups` (files in path order, Petastorm's rule
for which files are data); a rank reads its :class:`~sparkddl.data.plan.Piece` s (row
ranges of row groups) and nothing else, each epoch every piece of the sub-shard once, in a
seeded order, rows in file order (the reader gathers them in a seeded order as it batches).
The order depends only on the seed, the epoch, the rank and the sub-shard, so a resumed run
reads the same order. Decoding, re-batching and step counting are
:mod:`sparkddl.data.reader`'s.
"""
from __future__ import annotations

from typing import Any, Generator

import numpy as np

from sparkddl.data.batching import value_counts
from sparkddl.data.plan import ShardPlan, piece_order
from sparkddl.data.split import select_rows
from sparkddl.errors import DataError
from sparkddl.store import Store
from sparkddl.tables.parquet import list_row_groups, read_errors, unreadable


def read_sub_shard(plan: ShardPlan, rank: int, epoch: int, part: int, parts: int
                   ) -> Generator[Any, None, None]:
    """Arrow tables of the pieces of part ``part`` of ``parts`` of this rank's shard, one
    pass, in a seeded order, rows in file order."""
    import pyarrow.parquet as pq

    store = Store.from_uri(plan.url)
    filesystem = store.filesystem()
    root = store.fs_path(plan.url)
    layout = plan.table
    groups = list_row_groups(filesystem, layout)
    if plan.selection is not None:  # split by whole row groups: the other side's, unread
        groups = plan.selection.groups_of_side(root, groups)
    pieces = piece_order(plan, rank, epoch, part, parts)
    handles: list[Any] = []
    files: dict[str, Any] = {}  # each file opened, and its footer parsed, once per pass
    sel = plan.selection
    names = layout.file_columns(plan.names)  # in the files
    try:
        for piece in pieces:
            group = groups[piece.group]
            try:
                if group.path not in files:
                    handles.append(filesystem.open_input_file(group.path))
                    files[group.path] = pq.ParquetFile(handles[-1])
                columns = sel.read_columns(names) if sel else names
                table = files[group.path].read_row_group(
                    group.index, columns=layout.physical(columns))
                table = layout.logical(table)  # column mapping: the table's names
            except read_errors() as exc:  # deleted or rewritten under the fit
                raise unreadable(group.path, exc, f"rank {rank}, epoch {epoch}") from exc
            kept = layout.keep(filesystem, group)
            table = select_rows(sel, root, group.path, group.index, table, names, kept)
            if piece.rows != table.num_rows:  # the rows of another rank's piece: not used
                table = table.slice(piece.start, piece.rows)
            table = layout.add_columns(table, group.path, plan.names)  # partition columns
            check_table(plan, table, group.path, group.index)
            yield table
    finally:
        for handle in handles:  # ParquetFile.close() leaves a file it was handed open
            handle.close()


def check_table(plan: ShardPlan, table: Any, path: str, index: int) -> None:
    """Nulls and unequal array lengths, named with the file they are in: a table read in
    place can hold what its footers did not show."""
    import pyarrow as pa

    for col in plan.columns:
        values = table.column(col.name)
        where = f"column {col.name!r} of {path} (row group {index})"
        kind = values.type.value_type if hasattr(values.type, "value_type") else values.type
        if np.dtype(col.dtype).kind in "iu" and pa.types.is_floating(kind):
            # a file that differs from the one the driver planned with: never cast 3.5 to 3
            raise DataError(f"{where} is {values.type}, where the fit was planned for "
                            f"integers ({col.dtype}) from the table's other files; rewrite "
                            "that file with one type per column")
        if values.null_count:
            raise DataError(f"{where} has {values.null_count} null values; drop or fill them "
                            "first")
        if col.encoding != "list" or not len(values):
            continue
        arr = values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
        lengths = value_counts(arr)
        if lengths.min() != col.width or lengths.max() != col.width:
            raise DataError(f"{where} holds arrays of {sorted(set(lengths.tolist()))[:10]} "
                            f"values; every row needs {col.width}: pad or truncate them first")
        nulls = arr.flatten().null_count
        if nulls:
            raise DataError(f"{where} has arrays with {nulls} null elements; "
                            "fill or drop them first")
