"""Which DataFrames can be read where their Parquet lies, without a Spark job or a copy.

A DataFrame qualifies when its optimized plan is a plain scan of Parquet files under one
folder (a projection of columns at most: no filter, expression, cast, join, sample or limit
on top), every column training reads is a numeric scalar or a numeric array stored in those
files (not a partition column, not a Vector or decimal that Spark would have to convert),
and the files Spark would read are exactly the data files under that folder. Everything else
is materialized (:mod:`sparkddl.data.materialize`). The decision comes with the reason, which
the caller logs in one line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from sparkddl.data.plan import data_files
from sparkddl.store import Store

IN_PLACE_KINDS = ("integral", "floating", "boolean", "array:integral", "array:floating",
                  "binary", "string")


@dataclass(frozen=True)
class Decision:
    url: str | None  # the table's folder when it is read in place
    why: str


def decide(df: Any, columns: list[str], kinds: dict[str, str], types: dict[str, str],
           reader: str = "auto", rows_selected: bool = False) -> Decision:
    """Whether ``df`` is read in place for ``columns`` (``kinds`` from ``spark_kind``,
    ``types`` Spark's type names), and why (not)."""
    if rows_selected and reader == "petastorm":
        return Decision(None, "reader='petastorm' reads whole row groups and the validation "
                              "split of a table read in place selects rows inside them")
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return Decision(None, "the DataFrame's plan cannot be inspected from this session "
                              "(Spark Connect)")
    try:
        node = jdf.queryExecution().optimizedPlan()
    except Exception as exc:  # noqa: BLE001 - a plan Spark cannot optimize is materialized
        return Decision(None, f"its plan could not be inspected ({type(exc).__name__})")
    while _name(node) == "Project":
        plain = all(_name(node.projectList().apply(i)) == "AttributeReference"
                    for i in range(node.projectList().size()))
        if not plain:
            return Decision(None, "it computes columns (expressions, casts or renames) on top "
                                  "of the scan")
        node = node.child()
    if _name(node) != "LogicalRelation":
        return Decision(None, f"its plan is not a plain file scan (it has {_name(node)})")
    relation = node.relation()
    if _name(relation) != "HadoopFsRelation" or \
            _name(relation.fileFormat()) != "ParquetFileFormat":
        fmt = _name(relation.fileFormat()) if _name(relation) == "HadoopFsRelation" \
            else _name(relation)
        return Decision(None, f"it reads {fmt}, not plain Parquet")
    partition_cols = set(relation.partitionSchema().fieldNames())
    for name in columns:
        if name in partition_cols:
            return Decision(None, f"column {name!r} is a partition column (it is in the folder "
                                  "names, not in the files)")
        if kinds[name] not in IN_PLACE_KINDS or types[name].startswith("decimal") or \
                "decimal" in types[name]:
            return Decision(None, f"column {name!r} ({types[name]}) needs Spark to convert it")
    roots = relation.location().rootPaths()
    if roots.size() != 1:
        return Decision(None, f"it reads {roots.size()} root paths, not one folder")
    url = str(roots.apply(0).toUri())
    store = Store.from_uri(url)
    try:
        listed = data_files(store.filesystem(), store.fs_path(store.url()))
    except Exception as exc:  # noqa: BLE001 - e.g. the root is a file: materialize
        return Decision(None, f"its root {url} cannot be listed as a folder "
                              f"({type(exc).__name__})")
    mine = {_key(f.path) for f in listed}
    spark_reads = {_key(p) for p in df.inputFiles()}
    if mine != spark_reads:
        return Decision(None, f"Spark reads {len(spark_reads)} file(s) under {url} but the folder "
                              f"holds {len(mine)} data file(s)")
    return Decision(store.url(), "a plain Parquet scan of numeric columns")


def _name(obj: Any) -> str:
    return str(obj.getClass().getSimpleName())


def _key(path: str) -> str:
    """A file named by Spark (``file:/a/b``, ``s3a://bucket/k``) or by a pyarrow filesystem
    (``/a/b``, ``bucket/k``), compared without its scheme."""
    parsed = urlparse(path)
    return (parsed.netloc + parsed.path if parsed.scheme else path).lstrip("/")
