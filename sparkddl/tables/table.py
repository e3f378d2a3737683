"""A table read in place: the one thing the planner and the readers know of a table,
whatever its format.

A :class:`Table` is a folder's data files (listed when read: a plain Parquet folder, a fit's
own copy) or names its files one by one, in reading order (several roots, an explicit list,
a Delta version, an Iceberg snapshot, a partitioned folder), and carries what is not in the
files: each file's partition values (``year=2024/`` folders, the Delta log, Iceberg's
manifests), which the Arrow reader appends to every row group it reads as constant columns;
the rows deleted without rewriting a file (:mod:`sparkddl.tables.masks`: Delta deletion
vectors, Iceberg positional deletes); the files' names of the table's columns (Delta column
mapping); and each file's row count as the table's metadata says it, checked against its
footer. The formats build it: :mod:`~sparkddl.tables.parquet` and
:mod:`~sparkddl.tables.hive` (folders), :mod:`~sparkddl.tables.delta`,
:mod:`~sparkddl.tables.iceberg`. Petastorm, which lists a folder itself, reads only a
folder's files (:attr:`Table.listed` is False).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from sparkddl.errors import DataError

if TYPE_CHECKING:
    from sparkddl.tables.masks import RowMasks


@dataclass(frozen=True)
class Table:
    """The data files of a table read in place (filesystem paths, in reading order) and the
    partition columns' values of each file."""

    paths: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()  # partition columns the readers add
    types: tuple[str, ...] = ()  # their Arrow types (``int64``, ``float64``, ``bool``, ...)
    values: tuple[tuple[Any, ...], ...] = ()  # per path, one value per partition column
    # rows deleted from files without rewriting them (Delta deletion vectors, Iceberg
    # positional deletes), by path
    masks: RowMasks | None = None
    # column mapping (Delta): (the table's name, the name in the files, the Parquet field
    # id the files must give it, or 0 where the files are matched by name) of each column
    renames: tuple[tuple[str, str, int], ...] = ()
    # rows of each file as its table's log counts them (-1: not counted), checked against
    # the footers: a file rewritten under the log's name holds other rows
    records: tuple[int, ...] = ()
    # a folder whose every data file is the table (a plain Parquet folder, one Spark wrote,
    # or a fit's own copy): listed when read, so a file added later is a change, and
    # Petastorm may read it itself; ``paths`` is then empty
    folder: str = ""

    @classmethod
    def of_folder(cls, root: str) -> "Table":
        """Every data file under the folder ``root`` (a path of its filesystem)."""
        return cls(folder=root)

    @property
    def listed(self) -> bool:
        """Whether the files are named one by one (or carry what is not in them: partition
        values, row masks, column names), which only the Arrow reader reads; a folder's
        files alone, Petastorm reads too."""
        return not self.folder or bool(self.columns or self.masks or self.renames)

    def __post_init__(self) -> None:
        if self.columns and len(self.values) != len(self.paths):
            raise ValueError("a Table needs the partition values of every path")

    def file_columns(self, names: Iterable[str]) -> list[str]:
        """``names`` without the partition columns: what is read from the files."""
        return [n for n in names if n not in self.columns]

    def arrow_types(self) -> dict[str, Any]:
        import pyarrow as pa
        return {n: pa.type_for_alias(t) for n, t in zip(self.columns, self.types)}

    def add_columns(self, table: Any, path: str, names: list[str]) -> Any:
        """``table`` (read from ``path`` with :meth:`file_columns`) with the partition columns
        among ``names`` added as constants, columns in the order of ``names``."""
        wanted = [n for n in names if n in self.columns]
        if not wanted:
            return table
        import pyarrow as pa
        row = self.values[self._index[path]]
        types = self.arrow_types()
        for name in wanted:  # one value repeated by Arrow, no Python object per row
            value = pa.scalar(row[self.columns.index(name)], type=types[name])
            table = table.append_column(name, pa.repeat(value, table.num_rows))
        return table.select(names)

    def physical(self, names: Iterable[str]) -> list[str]:
        """``names`` (the table's) as the files name them."""
        return [self._to_physical.get(n, n) for n in names]

    def logical_name(self, name: str) -> str:
        """A column of the files by the table's name for it."""
        return self._to_logical.get(name, name)

    def logical(self, table: Any) -> Any:
        """``table`` (an Arrow table read from a file) with the table's column names."""
        if not self.renames:
            return table
        return table.rename_columns([self._to_logical.get(n, n) for n in table.column_names])

    def check_field_ids(self, schema: Any, names: Iterable[str], path: str) -> None:
        """DataError where a column of ``names`` in ``path``'s Arrow ``schema`` is not the
        one the table's field id names (column mapping by id): a file written before a drop
        and re-add of a column of the same name holds other values under it."""
        ids = {logical: field_id for logical, _, field_id in self.renames if field_id}
        for name in names:
            if name not in ids:
                continue
            index = schema.get_field_index(self._to_physical.get(name, name))
            meta = (schema.field(index).metadata or {}) if index >= 0 else {}
            found = meta.get(b"PARQUET:field_id")
            if found is None or int(found) != ids[name]:
                raise DataError(f"column {name!r} of the table is field id {ids[name]}, and "
                                f"{path} holds {'no such column' if index < 0 else 'field id '}"
                                f"{'' if index < 0 else found.decode() if found else 'none'} "
                                "under its name; the file is not this table's (read the "
                                "table through Spark with Delta Lake)")

    @functools.cached_property
    def _to_physical(self) -> dict[str, str]:
        return {logical: physical for logical, physical, _ in self.renames}

    @functools.cached_property
    def _to_logical(self) -> dict[str, str]:
        return {physical: logical for logical, physical, _ in self.renames}

    def keep(self, filesystem: Any, group: Any) -> Any:
        """True for the rows of row group ``group`` (a RowGroup) that are not deleted; None
        where none is (no deletion vector, or none of its rows in this group)."""
        if not self.masks:
            return None
        return self.masks.keep(filesystem, group.path, group.file_rows, group.first,
                                 group.rows)

    def kept_rows(self, filesystem: Any, group: Any) -> int:
        """Rows of ``group`` that are not deleted."""
        keep = self.keep(filesystem, group)
        return group.rows if keep is None else int(keep.sum())

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.paths)}

    def mask_identity(self) -> list[list[str]]:
        """What the table's row masks are (file, descriptor), for its fingerprint: a DELETE
        that rewrites none of the data files changes them alone."""
        return self.masks.identity() if self.masks else []


def as_table(where: "Table | str") -> Table:
    """A Table, or the folder (a path of its filesystem) whose data files are one."""
    return where if isinstance(where, Table) else Table.of_folder(where)
