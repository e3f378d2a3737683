"""Reading a prepared dataset on the driver: samples, and validation data streamed in batches
(never the whole split in memory)."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from sparkddl.data.batching import Chunk, decode_arrow
from sparkddl.data.dataset import Dataset
from sparkddl.data.plan import Piece, shard_pieces
from sparkddl.data.split import select_rows
from sparkddl.store import Store
from sparkddl.tables.parquet import RowGroup, check_unchanged, list_row_groups, parquet_file

STREAM_ROWS = 65_536  # rows decoded at once on the driver
READ_BUFFER = 1 << 20  # bytes read ahead from a file: pages, not whole column chunks


def row_groups(dataset: Dataset, rank: int = 0, world: int = 1) -> Iterator[Chunk]:
    """Every row group of ``dataset`` in order (Petastorm's), decoded, with its split's rows
    only, streamed in parts of at most ``STREAM_ROWS`` rows: a large row group is never
    whole in memory. With ``world`` > 1, ``rank``'s pieces only (the training shards' rule,
    :func:`shard_pieces`, in file order): every row in exactly one rank's share, the
    shares equal to a row."""
    import pyarrow as pa

    store = Store.from_uri(dataset.url)
    fs = store.filesystem()
    root = store.fs_path(dataset.url)
    layout = dataset.table
    names = [c.name for c in dataset.columns]
    in_files = layout.file_columns(names)
    sel = dataset.selection
    if dataset.files:  # read in place: a file removed since must not just go missing
        check_unchanged(fs, root, dataset.files, "the driver", layout)
    groups = list_row_groups(fs, layout)
    if sel is not None:  # split by whole row groups: the other side's, unread
        groups = sel.groups_of_side(root, groups)
    if world > 1:
        pieces = sorted(shard_pieces(dataset.shared_groups, world)[rank],
                        key=lambda p: p.group)
    else:
        pieces = [Piece(i, 0, g.rows) for i, g in enumerate(groups)]  # all of each
    for piece in pieces:
        group = groups[piece.group]
        start = kept = 0  # rows of the group read, and of its split's rows
        alive = layout.keep(fs, group)  # not deleted
        columns = sel.read_columns(in_files) if sel else in_files
        for part in _parts(fs, group, layout.physical(columns)):
            table = layout.logical(pa.Table.from_batches([part]))  # the table's names
            part_alive = None if alive is None else alive[start:start + part.num_rows]
            table = select_rows(sel, root, group.path, group.index, table, in_files,
                                part_alive, start, group.rows)
            start += part.num_rows
            # the piece's rows of the group, counted among its split's: start..stop
            first, kept = kept, kept + table.num_rows
            lo, hi = max(piece.start - first, 0), min(piece.stop - first, table.num_rows)
            table = table.slice(lo, max(hi - lo, 0))
            table = layout.add_columns(table, group.path, names)
            if table.num_rows:
                yield {c.name: decode_arrow(c, table.column(c.name)) for c in dataset.columns}
            if kept >= piece.stop:
                break


def _parts(fs: Any, group: RowGroup, columns: list[str]) -> Iterator[Any]:
    """Record batches of ``group``; a file that cannot be read is a DataError naming it
    (what is done with the rows is not: its errors are not the file's)."""
    with parquet_file(fs, group.path, buffer_size=READ_BUFFER) as f:
        yield from f.iter_batches(batch_size=STREAM_ROWS, row_groups=[group.index],
                                  use_threads=False, columns=columns)


def batches(dataset: Dataset, size: int, rank: int = 0, world: int = 1) -> Iterator[Chunk]:
    """The rows of ``dataset`` (``rank``'s share of ``world``) in :func:`row_groups` order,
    cut into batches of exactly ``size`` rows (the last one shorter): the same batches
    whatever the row-group sizes."""
    pending: list[Chunk] = []
    held = 0
    for chunk in row_groups(dataset, rank, world):
        pending.append(chunk)
        held += len(next(iter(chunk.values())))
        while held >= size:
            whole = _concat(pending)
            yield {k: v[:size] for k, v in whole.items()}
            rest = {k: v[size:] for k, v in whole.items()}
            held -= size
            pending = [rest] if held else []
    if held:
        yield _concat(pending)


def _concat(chunks: list[Chunk]) -> Chunk:
    if len(chunks) == 1:
        return chunks[0]
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def read_rows(dataset: Dataset, limit: int | None = None) -> Chunk:
    """All rows (or the first ``limit``) of ``dataset`` as decoded numpy arrays."""
    chunks: list[Chunk] = []
    seen = 0
    for chunk in row_groups(dataset):
        chunks.append(chunk)
        seen += len(next(iter(chunk.values())))
        if limit is not None and seen >= limit:
            break
    if not chunks:
        return {c.name: np.zeros((0, *c.shape), dtype=c.dtype) for c in dataset.columns}
    out = _concat(chunks)
    return {n: v[:limit] for n, v in out.items()} if limit is not None else out


def validation_batches(dataset: Dataset, transform: Any, shapes: Any, where: str,
                       rank: int = 0, world: int = 1, size: int = 1024) -> Iterator[Any]:
    """``rank``'s share of a validation split as batches of torch tensors, through the
    transformFn if there is one (``where`` names the place in its errors)."""
    from sparkddl.data.batching import to_tensors
    if transform is None:
        yield from map(to_tensors, batches(dataset, size, rank, world))
        return
    from sparkddl.data.transform import Shapes, apply
    seen = Shapes(shapes)
    for i, batch in enumerate(batches(dataset, size, rank, world)):
        yield apply(transform, batch, f"{where}, validation batch {i}", seen)
