"""Shard plans: which rows each rank reads, and how many steps every rank takes per epoch.

Computed once on the driver from Parquet footers. Rows, not row groups, are the unit: the
row groups (files in path order, row groups in file order) are put in an order drawn from
the seed, and that sequence of rows is cut into ``world`` contiguous runs of equal length
(±1 row), whatever the row-group sizes, the file count and the world size. A rank's shard is
a list of :class:`Piece` s, (row group, first row, end row); a row group that straddles two
ranks is split by row range, so each rank decodes at most two row groups it shares with
another. Both readers (Petastorm, and ``pyarrow.parquet.ParquetFile`` where Petastorm cannot
load) read exactly those pieces; :func:`resolve_reader` picks one.

Every rank runs ``steps_per_epoch`` steps, the same on all (an allreduce never waits for a
rank that ran out of data), so an epoch trains every row once except the
``total % (world * batch_size)`` rows left over (fewer than ``world * batch_size``): each
rank leaves out the rows of its last, partial batch. The rank's piece order and its shuffle
buffer are reseeded every epoch (by seed, epoch and rank), so different rows are left out
each time; none is seen twice within an epoch.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkddl.data.choice import raw_in_place, resolve_reader
from sparkddl.data.schema import ColumnSpec
from sparkddl.data.split import Selection
from sparkddl.errors import DataError
from sparkddl.tables.table import Table

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Piece:
    """Rows ``start``..``stop`` of the ``group``-th row group of the dataset (counted among
    the rows its split keeps, in file order)."""

    group: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class ShardPlan:
    """What the ranks of one run read; built on the driver, shipped in the task spec."""

    url: str
    columns: tuple[ColumnSpec, ...]
    world: int
    batch_size: int
    steps_per_epoch: int
    rows_per_rank: tuple[int, ...]
    row_groups: tuple[int, ...] = ()  # rows per row group of the whole dataset
    seed: int = 0
    shuffle_buffer: int = 10_000  # rows; 0 = no in-memory shuffle
    reader_workers: int = 2
    reader_pool: str = "thread"
    # bytes of decoded pieces a rank keeps after the first epoch (0: none), read again
    # from memory in later epochs
    cache_bytes: int = 0
    # the choice as asked, not as resolved: every rank resolves it again for its own Python
    reader: str = "auto"
    # Parquet read in place: the rows of every row group this plan keeps (its side of the
    # validation split; row_groups count the kept rows), and (path, size, mtime_ns) of every
    # data file as planned, so that a file changed during the fit is noticed
    selection: Selection | None = None
    files: tuple[tuple[str, int, int], ...] = ()
    # the transformFn, run on the reader's threads on every batch before it is handed over,
    # and what it returned for the driver's sample: (column, per-row shape, dtype)
    transform: Any = None
    transform_shapes: tuple[tuple[str, tuple[int, ...], str], ...] = ()
    # the table read: every data file under ``url``, or its files named one by one (several
    # roots, a file list, a Delta version, partition columns read), with their partition
    # values, row masks and column names (every data file under ``url`` where none is given)
    table: Table = None  # type: ignore[assignment]  # None: __post_init__ gives the folder's

    def __post_init__(self) -> None:
        if self.table is None:
            object.__setattr__(self, "table", folder_table(self.url))

    @property
    def raw_in_place(self) -> bool:
        return raw_in_place(self.files, self.columns)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def rows_per_epoch(self) -> int:
        """Rows trained per epoch, by all ranks together."""
        return self.steps_per_epoch * self.batch_size * self.world

    @property
    def rows(self) -> int:
        return sum(self.row_groups)

    @property
    def rows_skipped(self) -> int:
        """Rows left out of every epoch: fewer than ``world * batch_size``."""
        return self.rows - self.rows_per_epoch

    def pieces(self, rank: int) -> list[Piece]:
        """``rank``'s shard, in the plan's order (:func:`shard_pieces`)."""
        return _pieces(tuple(self.row_groups), self.world, self.seed)[rank]


def group_order(row_group_rows: Any, seed: int) -> list[int]:
    """The row groups with rows, in the order the ranks' runs are cut from: a permutation
    drawn from the seed alone (the same every epoch, so each rank keeps its rows and a
    resumed run reads the same), so that a table sorted by a column is not split by its
    ranges."""
    order = np.random.default_rng([seed, 0x5eed]).permutation(len(row_group_rows))
    return [int(i) for i in order if row_group_rows[i]]


def shard_pieces(row_group_rows: Any, world: int, seed: int = 0) -> list[list[Piece]]:
    """Every rank's pieces: the rows of the row groups in :func:`group_order`, cut into
    ``world`` runs of ``total // world`` or one more rows (the first ``total % world`` ranks
    get the extra row). Every row is in exactly one piece of one rank."""
    rows = [int(n) for n in row_group_rows]
    total = sum(rows)
    bounds = [r * (total // world) + min(r, total % world) for r in range(world + 1)]
    shards: list[list[Piece]] = [[] for _ in range(world)]
    rank, at = 0, 0  # at: rows of the sequence before the current group
    for group in group_order(rows, seed):
        start = 0
        while start < rows[group]:
            while at + start >= bounds[rank + 1]:
                rank += 1
            stop = min(rows[group], bounds[rank + 1] - at)
            shards[rank].append(Piece(group, start, stop))
            start = stop
        at += rows[group]
    return shards


@functools.lru_cache(maxsize=16)
def _pieces(row_group_rows: tuple[int, ...], world: int, seed: int) -> list[list[Piece]]:
    return shard_pieces(row_group_rows, world, seed)


def shard_rows(row_group_rows: Any, world: int) -> list[int]:
    """Rows per rank: ``total // world``, the first ``total % world`` ranks one more."""
    total = sum(row_group_rows)
    return [total // world + (1 if r < total % world else 0) for r in range(world)]


def sub_shard(pieces: list[Piece], part: int, parts: int) -> list[Piece]:
    """Part ``part`` of ``parts`` of a rank's pieces (one per reader thread): every
    ``parts``-th piece, so that the parts together hold each piece once."""
    return pieces[part::parts]


def piece_order(plan: "ShardPlan", rank: int, epoch: int, part: int, parts: int
                ) -> list[Piece]:
    """The pieces of part ``part`` of ``parts`` of ``rank``'s shard in the order an epoch
    reads them: a permutation drawn from (seed, epoch, rank, part), whichever reader reads
    them (or memory, :mod:`sparkddl.data.reader`'s epoch cache), so that a resumed run
    reads the same order."""
    pieces = sub_shard(plan.pieces(rank), part, parts)
    order = np.random.default_rng([plan.seed, epoch, rank, part]).permutation(len(pieces))
    return [pieces[i] for i in order]


def check_enough_rows(rows: int, world: int, batch_size: int) -> None:
    """Every rank needs at least one full batch per epoch."""
    if rows < world * batch_size:
        raise DataError(f"{rows} training rows are fewer than num_workers × batch_size = "
                        f"{world} × {batch_size}; lower batchSize or numWorkers, or add data")


def plan_shards(url: str, columns: tuple[ColumnSpec, ...], row_group_rows: list[int], world: int,
                batch_size: int, **options: Any) -> ShardPlan:
    """Share the rows out by :func:`shard_pieces` and count the steps every rank takes per
    epoch. ``options`` are the reader fields of :class:`ShardPlan`; its ``reader`` choice is
    checked here, on the driver."""
    rows = shard_rows(row_group_rows, world)
    plan = ShardPlan(url=url, columns=columns, world=world, batch_size=batch_size,
                     steps_per_epoch=min(rows) // batch_size, rows_per_rank=tuple(rows),
                     row_groups=tuple(row_group_rows), **options)
    resolve_reader(plan.reader, rows_selected=plan.selection is not None, url=url,
                   raw_in_place=plan.raw_in_place, listed=plan.table.listed)
    check_enough_rows(sum(row_group_rows), world, batch_size)
    return plan


def folder_table(url: str) -> Table:
    """The table of every data file under the folder at ``url``."""
    from sparkddl.store import Store
    store = Store.from_uri(url)
    return Table.of_folder(store.fs_path(store.url()))
