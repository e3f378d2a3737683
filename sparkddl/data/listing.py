"""Tables whose data files are named one by one: several root folders, an explicit list of
files, a Delta Lake version, or a partitioned table whose partition columns are trained on.

A :class:`Listing` replaces "every data file under the root" for the readers: the files in
reading order, and for each the values of the table's partition columns, which live in the
folder names (``year=2024/``) or the Delta log, not in the files. The Arrow reader appends
them to every row group it reads as constant columns; Petastorm, which lists a folder
itself, is never given a listing.
"""
from __future__ import annotations

import functools
import posixpath
from dataclasses import dataclass
from typing import Any, Iterable
from urllib.parse import unquote

from sparkddl.errors import DataError

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # what Spark and Hive name a null value's folder

# Spark's type names (simpleString) of partition columns read in place, as Arrow types
SPARK_TYPES = {"tinyint": "int8", "smallint": "int16", "int": "int32", "bigint": "int64",
               "float": "float32", "double": "float64", "boolean": "bool", "string": "string"}


@dataclass(frozen=True)
class Listing:
    """The data files of a table read in place (filesystem paths, in reading order) and the
    partition columns' values of each file."""

    paths: tuple[str, ...]
    columns: tuple[str, ...] = ()  # partition columns the readers add
    types: tuple[str, ...] = ()  # their Arrow types (``int64``, ``float64``, ``bool``, ...)
    values: tuple[tuple[Any, ...], ...] = ()  # per path, one value per partition column
    # rows deleted from files without rewriting them (Delta deletion vectors), by path
    deletes: Any = None  # sparkddl.data.deletes.Deletes
    # column mapping (Delta): (the table's name, the name in the files, the Parquet field
    # id the files must give it, or 0 where the files are matched by name) of each column
    renames: tuple[tuple[str, str, int], ...] = ()
    # rows of each file as its table's log counts them (-1: not counted), checked against
    # the footers: a file rewritten under the log's name holds other rows
    records: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.columns and len(self.values) != len(self.paths):
            raise ValueError("a Listing needs the partition values of every path")

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
        if not self.deletes:
            return None
        return self.deletes.keep(filesystem, group.path, group.file_rows, group.first,
                                 group.rows)

    def kept_rows(self, filesystem: Any, group: Any) -> int:
        """Rows of ``group`` that are not deleted."""
        keep = self.keep(filesystem, group)
        return group.rows if keep is None else int(keep.sum())

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.paths)}


def hive_values(root: str, path: str) -> dict[str, str]:
    """The ``name=value`` folders of ``path`` below ``root`` (values unescaped as Spark
    writes them)."""
    rel = posixpath.relpath(posixpath.dirname(path), root) if root else posixpath.dirname(path)
    found = {}
    for part in rel.split("/"):
        if "=" in part and part not in (".", ".."):
            name, value = part.split("=", 1)
            found[unquote(name)] = unquote(value)
    return found


def convert(value: str, arrow_type: str, column: str, path: str) -> Any:
    """A partition folder's ``value`` as a value of ``arrow_type``; DataError for a null
    partition or a value that is not of the type."""
    if value == NULL_PARTITION:
        raise DataError(f"partition column {column!r} is null for {path}; a partition column "
                        "trained on needs a value in every partition (fill it, or filter the "
                        "null partition out: the DataFrame is then materialized)")
    try:
        if arrow_type.startswith("int"):
            return int(value)
        if arrow_type.startswith("float"):
            return float(value)
        if arrow_type == "bool":
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
    except ValueError:
        raise DataError(f"partition column {column!r} of {path} has value {value!r}, which is "
                        f"not a {arrow_type}") from None
    return value


def infer_type(values: list[str]) -> str:
    """The Arrow type Spark's partition inference would give folder values (integers, then
    doubles, then booleans, else strings)."""
    present = [v for v in values if v != NULL_PARTITION]
    for arrow_type, parse in (("int64", int), ("float64", float)):
        try:
            for v in present:
                parse(v)
            return arrow_type
        except ValueError:
            continue
    if present and all(v.lower() in ("true", "false") for v in present):
        return "bool"
    return "string"


def hive_listing(root: str, paths: list[str], columns: list[str],
                 types: dict[str, str] | None = None) -> Listing:
    """A :class:`Listing` of ``paths`` whose partition ``columns`` come from their
    ``name=value`` folders below ``root``; ``types`` (Arrow type names) where Spark gave
    them, else inferred from the values."""
    found = [hive_values(root, p) for p in paths]
    for path, values in zip(paths, found):
        missing = [c for c in columns if c not in values]
        if missing:
            raise DataError(f"{path} is not in a {missing[0]}=<value> folder below {root}; "
                            "every file of a partitioned table needs one per partition column")
    types = dict(types or {})
    for c in columns:
        types.setdefault(c, infer_type([v[c] for v in found]))
    return Listing(tuple(paths), tuple(columns), tuple(types[c] for c in columns),
                   tuple(tuple(convert(v[c], types[c], c, p) for c in columns)
                         for p, v in zip(paths, found)))


def partition_names(root: str, paths: Iterable[str]) -> list[str]:
    """The partition columns of a hive-style table: the ``name=`` folders every file has."""
    names: list[str] | None = None
    for path in paths:
        mine = list(hive_values(root, path))
        names = mine if names is None else [n for n in names if n in mine]
    return names or []
