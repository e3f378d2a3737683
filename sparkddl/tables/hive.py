"""Hive-style partitioned tables: the ``name=value`` folders of a table's files hold its
partition columns' values (Spark writes them so), which a :class:`~sparkddl.tables.table.Table`
carries for the readers to add as constant columns."""
from __future__ import annotations

import posixpath
from typing import Any, Iterable
from urllib.parse import unquote

from sparkddl.errors import DataError
from sparkddl.tables.table import Table

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # what Spark and Hive name a null value's folder

# Spark's type names (simpleString) of partition columns read in place, as Arrow types
SPARK_TYPES = {"tinyint": "int8", "smallint": "int16", "int": "int32", "bigint": "int64",
               "float": "float32", "double": "float64", "boolean": "bool", "string": "string"}


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


def hive_table(root: str, paths: list[str], columns: list[str],
                 types: dict[str, str] | None = None) -> Table:
    """A :class:`Table` of ``paths`` whose partition ``columns`` come from their
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
    return Table(tuple(paths), tuple(columns), tuple(types[c] for c in columns),
                   tuple(tuple(convert(v[c], types[c], c, p) for c in columns)
                         for p, v in zip(paths, found)))


def partition_names(root: str, paths: Iterable[str]) -> list[str]:
    """The partition columns of a hive-style table: the ``name=`` folders every file has."""
    names: list[str] | None = None
    for path in paths:
        mine = list(hive_values(root, path))
        names = mine if names is None else [n for n in names if n in mine]
    return names or []
