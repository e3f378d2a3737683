"""Shard plans: which rows each rank reads, and how many steps every rank takes per epoch.

Computed once on the driver from Parquet footers, with Petastorm's shard rule (the i-th
row group of the dataset, files in path order, belongs to shard ``i % world``), so that
every rank runs exactly the same number of steps and an allreduce can never wait for a
rank that ran out of data.

Remainder: each rank uses ``steps_per_epoch * batch_size`` of its rows per epoch; the rest
of its shard (fewer than a batch, plus any excess over the smallest shard) is skipped for
that epoch. Row-group order and the shuffle buffer are reseeded every epoch, so different
rows are skipped each time; none is seen twice within an epoch.
"""
from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass
from typing import Any

from sparkddl.data.schema import ColumnSpec
from sparkddl.errors import DataError

log = logging.getLogger(__name__)

# above this share of rows skipped per epoch, every rank reads the whole (small) dataset
# and keeps every world-th row instead of whole row groups
MAX_SKIPPED_SHARE = 0.25


@dataclass(frozen=True)
class RowGroup:
    path: str  # path inside the dataset's filesystem
    index: int  # row group number inside the file
    rows: int


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
    stride: bool = False  # True: every rank reads all row groups, keeps rows i % world == rank
    seed: int = 0
    shuffle_buffer: int = 10_000  # rows; 0 = no in-memory shuffle
    reader_workers: int = 2
    reader_pool: str = "thread"

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def rows_per_epoch(self) -> int:
        return self.steps_per_epoch * self.batch_size * self.world


def list_row_groups(filesystem: Any, root: str) -> list[RowGroup]:
    """Every row group under ``root`` in Petastorm's order: data files sorted by path (names
    starting with '_' or '.' and checksum files are not data), row groups in file order."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    files = sorted(i.path for i in infos if i.type == pafs.FileType.File and _is_data(root, i.path))
    groups = []
    for path in files:
        with filesystem.open_input_file(path) as f:
            meta = pq.ParquetFile(f).metadata
        groups += [RowGroup(path, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    return groups


def _is_data(root: str, path: str) -> bool:
    """pyarrow's legacy dataset rule, which Petastorm inherits."""
    parts = posixpath.relpath(path, root).split("/")
    return not any(p.startswith(("_", ".")) or p.endswith((".crc", "_$folder$")) for p in parts)


def shard_rows(row_group_rows: list[int], world: int) -> list[int]:
    """Rows per rank under Petastorm's rule: row group i goes to rank i % world."""
    rows = [0] * world
    for i, n in enumerate(row_group_rows):
        rows[i % world] += n
    return rows


def stride_rows(total: int, world: int) -> list[int]:
    return [len(range(r, total, world)) for r in range(world)]


def plan_shards(url: str, columns: tuple[ColumnSpec, ...], row_group_rows: list[int], world: int,
                batch_size: int, **reader: Any) -> ShardPlan:
    """Choose row-group sharding (or row striding for datasets with too few or too uneven
    row groups) and the common number of steps per epoch."""
    total = sum(row_group_rows)
    if total < world * batch_size:
        raise DataError(f"{total} training rows are fewer than num_workers × batch_size = "
                        f"{world} × {batch_size}; lower batchSize or numWorkers, or add data")
    by_group = shard_rows(row_group_rows, world)
    used_by_group = world * (min(by_group) // batch_size) * batch_size
    stride = used_by_group < (1 - MAX_SKIPPED_SHARE) * total
    rows = stride_rows(total, world) if stride else by_group
    if stride:
        log.warning("%d row group(s) cannot be shared evenly by %d ranks (rows per rank would be "
                    "%s); every rank reads the whole dataset and keeps its rows i %% %d == rank. "
                    "Materialize larger datasets through sparkddl, which sizes row groups for "
                    "the ranks.", len(row_group_rows), world, by_group, world)
    steps = min(rows) // batch_size
    return ShardPlan(url=url, columns=columns, world=world, batch_size=batch_size,
                     steps_per_epoch=steps, rows_per_rank=tuple(rows),
                     row_groups=tuple(row_group_rows), stride=stride, **reader)
