"""Row selections inside row groups: the validation split of Parquet read in place.

A table read where it lies cannot be rewritten into a training part and a validation part,
so both parts are the same files with a selection applied to every row group as it is read:

- by fraction: a row is a validation row when a uniform draw, seeded by ``(seed, the file's
  path relative to the dataset, the row group's index)`` and taken at the row's position in
  its row group, falls below the fraction. Every row independently, as ``rand(seed) < f``
  does in the materialized split: the count is binomial, not exact, and the rows chosen are
  not the ones the materialized split chooses with the same seed. The split is reproducible
  while the files are unchanged; rewriting (compacting) a table reshuffles it.
- by fraction, whole row groups (``groups``): where the table has at least
  ``GROUP_SPLIT_MIN`` row groups, the row groups are ordered by a seeded draw for each (the
  same seed, path and index) and taken in that order until they hold the fraction of the
  rows (within half a row group of it): those go to validation whole. Readers then skip the
  other side's row groups unread: a snapshot's evaluation reads the validation groups
  only, and training the training groups only. The share is that of row groups (rows of
  one row group were usually written together and may be alike: tables sorted by a column
  split by that column's ranges, which the per-row split does not).
- by column: a row is a validation row when its boolean / 0-1 column is true / 1.

The driver counts the selected rows of every row group when planning (the fraction from the
footers alone; a column by reading that one column), so shard plans and equal steps work on
the selected rows exactly as on a materialized split.
"""
from __future__ import annotations

import posixpath
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkddl.errors import DataError

TAKES = ("train", "val")
# from this many row groups, a fraction split goes by whole row groups
GROUP_SPLIT_MIN = 16


@dataclass(frozen=True)
class Selection:
    """Which rows of every row group a dataset keeps: its ``take`` side of the split."""

    take: str  # "train" or "val"
    fraction: float = 0.0
    seed: int = 0
    column: str | None = None  # split by a boolean / 0-1 column instead of a fraction
    groups: bool = False  # a fraction split by whole row groups...
    chosen: frozenset[tuple[str, int]] = frozenset()  # ...these (path in the table, index)
    # row groups whose rows are all deleted (deletion vectors): on neither side
    empty: frozenset[tuple[str, int]] = frozenset()

    def __post_init__(self) -> None:
        assert self.take in TAKES, self.take
        assert (self.column is None) == (0 < self.fraction < 1), (self.column, self.fraction)

    def skips(self, root: str, path: str, index: int) -> bool:
        """Whether row group ``index`` of ``path`` holds none of this side's rows, known
        without reading it (a split by whole row groups)."""
        if not self.groups:
            return False
        return self.holds(root, path, index) != (self.take == "val")

    def holds(self, root: str, path: str, index: int) -> bool:
        """Whether row group ``index`` of ``path`` went to validation whole."""
        return (relative(root, path), index) in self.chosen

    def groups_of_side(self, root: str, groups: list[Any]) -> list[Any]:
        """``groups`` (RowGroups, in order) that hold this side's rows: all of them for a
        split inside row groups; for one by whole row groups, this side's non-empty ones,
        which the readers then share out as if they were the whole table."""
        if not self.groups:
            return groups
        return [g for g in groups if g.rows and not self.skips(root, g.path, g.index) and
                (relative(root, g.path), g.index) not in self.empty]

    def read_columns(self, names: list[str]) -> list[str]:
        """The columns to read so that :meth:`apply` can select rows."""
        return names + [self.column] if self.column and self.column not in names else names

    def mask(self, root: str, path: str, index: int, table: Any, start: int = 0,
             group_rows: int | None = None) -> np.ndarray:
        """True for the rows of ``table`` (read with :meth:`read_columns`) that this side
        keeps: all of row group ``index``, or its rows ``start..`` of ``group_rows``."""
        val = validation_rows(self, root, path, index, table, start, group_rows)
        return val if self.take == "val" else ~val

    def apply(self, root: str, path: str, index: int, table: Any, names: list[str],
              start: int = 0, group_rows: int | None = None, kept: Any = None) -> Any:
        """``table`` with only this side's rows and only ``names``; ``kept``: the rows not
        deleted (a deletion vector's mask), which no side keeps."""
        import pyarrow as pa
        keep = self.mask(root, path, index, table, start, group_rows)
        if kept is not None:
            keep &= kept
        if not keep.all():
            table = table.filter(pa.array(keep))
        return table.select(names)


def select_rows(sel: Selection | None, root: str, path: str, index: int, table: Any,
                names: list[str], kept: Any = None, start: int = 0,
                group_rows: int | None = None) -> Any:
    """``table`` (rows ``start..`` of row group ``index`` of ``path``) with the rows the split
    ``sel`` keeps (all without one) that are not deleted (``kept``, a deletion vector's mask
    of the same rows, or None)."""
    if sel is not None:
        return sel.apply(root, path, index, table, names, start, group_rows, kept=kept)
    return table if kept is None else table.filter(kept)


def validation_rows(sel: Selection, root: str, path: str, index: int, table: Any,
                    start: int = 0, group_rows: int | None = None) -> np.ndarray:
    if sel.groups:
        return np.full(table.num_rows, sel.holds(root, path, index))
    if sel.column is None:
        rows = fraction_rows(sel.fraction, sel.seed, root, path, index,
                             table.num_rows if group_rows is None else group_rows)
        return rows[start:start + table.num_rows]
    return column_rows(sel.column, table.column(sel.column), f"{path} row group {index}")


def fraction_rows(fraction: float, seed: int, root: str, path: str, index: int,
                  rows: int) -> np.ndarray:
    rel = posixpath.relpath(path, root) if root and path != root else posixpath.basename(path)
    rng = np.random.default_rng([seed, zlib.crc32(rel.encode()), index])
    return rng.random(rows) < fraction


def relative(root: str, path: str) -> str:
    return posixpath.relpath(path, root) if root and path != root else posixpath.basename(path)


def choose_groups(fraction: float, seed: int, root: str, groups: list[Any]
                  ) -> frozenset[tuple[str, int]]:
    """The row groups (path in the table, index) that go to validation whole: in the order
    of a seeded draw for each, as many as bring their rows closest to the fraction."""
    def draw(g: Any) -> float:
        rel = relative(root, g.path)
        return float(np.random.default_rng([seed, zlib.crc32(rel.encode()), g.index, 1])
                     .random())
    target, held, chosen = fraction * sum(g.rows for g in groups), 0, []
    for g in sorted(groups, key=draw):
        if held + g.rows / 2 > target:
            break
        chosen.append((relative(root, g.path), g.index))
        held += g.rows
    return frozenset(chosen)


def column_rows(name: str, values: Any, where: str) -> np.ndarray:
    import pyarrow as pa
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if arr.null_count:
        raise DataError(f"validation column {name!r} has {arr.null_count} null values in "
                        f"{where}; fill them with 0/false first")
    out = arr.to_numpy(zero_copy_only=False)
    if out.dtype != bool:
        bad = int(np.count_nonzero((out != 0) & (out != 1)))
        if bad:
            raise DataError(f"validation column {name!r} has {bad} values in {where} that are "
                            "neither 0/1 nor true/false")
        out = out == 1
    return out
