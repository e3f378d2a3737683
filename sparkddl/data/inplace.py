"""Which DataFrames can be read where their Parquet lies, without a Spark job or a copy.

A DataFrame qualifies when its optimized plan is a plain scan of Parquet files (a projection
of columns at most: no filter, expression, cast, join, sample or limit on top) and every
column training reads is a numeric scalar or a numeric array stored in those files, or a
number, boolean or string partition column (not a Vector or decimal that Spark would have
to convert). When Spark reads exactly the data files under one folder and no partition
column is used, the readers list that folder; otherwise (several root paths, a list of
files, partition columns used as features or labels) they get the files Spark reads, named
one by one (a :class:`~sparkddl.tables.table.Table`). Everything else is materialized
(:mod:`sparkddl.data.materialize`). The decision comes with the reason, which the caller
logs in one line.
"""
from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass
from typing import Any

from sparkddl.errors import DataError
from sparkddl.store import Store, decode_hadoop_uri
from sparkddl.store.store import split_uri
from sparkddl.tables.delta import is_delta, scan_table
from sparkddl.tables.handed import handed
from sparkddl.tables.hive import SPARK_TYPES, hive_table
from sparkddl.tables.parquet import data_files
from sparkddl.tables.table import Table

log = logging.getLogger(__name__)

DELTA_FORMAT = "DeltaParquetFileFormat"  # what a Delta Lake scan's relation reads
IN_PLACE_KINDS = ("integral", "floating", "boolean", "array:integral", "array:floating",
                  "binary", "string")


@dataclass(frozen=True)
class Decision:
    url: str | None  # the table's folder when it is read in place
    why: str
    # its files one by one, where they are not every data file under that folder
    table: Table | None = None


def decide(df: Any, columns: list[str], kinds: dict[str, str], types: dict[str, str],
           reader: str = "auto", rows_selected: bool = False,
           split_column: str | None = None) -> Decision:
    """Whether ``df`` is read in place for ``columns`` (``kinds`` from ``spark_kind``,
    ``types`` Spark's type names), and why (not)."""
    if rows_selected and reader == "petastorm":
        return Decision(None, "reader='petastorm' reads whole row groups and the validation "
                              "split of a table read in place selects rows inside them")
    delta = handed(df)
    if delta is not None:  # sparkddl.read_delta's or read_iceberg's DataFrame, as returned
        # delta: the (url, listing) pair read_delta and read_iceberg set
        return _delta_frame(*delta, columns, kinds, types, reader, split_column)  # pyright: ignore[reportCallIssue]
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
    fmt = _name(relation.fileFormat()) if _name(relation) == "HadoopFsRelation" \
        else _name(relation)
    if fmt not in ("ParquetFileFormat", DELTA_FORMAT):
        return Decision(None, f"it reads {fmt}, not plain Parquet")
    partition_cols = set(relation.partitionSchema().fieldNames())
    parts = [name for name in columns if name in partition_cols]
    for name in columns:
        if kinds[name] not in IN_PLACE_KINDS or types[name].startswith("decimal") or \
                "decimal" in types[name]:
            return Decision(None, f"column {name!r} ({types[name]}) needs Spark to convert it")
        if name in partition_cols and types[name] not in SPARK_TYPES:
            return Decision(None, f"partition column {name!r} is {types[name]}, which is read "
                                  "in place only as a number, boolean or string")
    if parts and rows_selected and split_column in parts:
        return Decision(None, f"the validation column {split_column!r} is a partition column")
    roots = [decode_hadoop_uri(str(relation.location().rootPaths().apply(i).toUri()))
             for i in range(relation.location().rootPaths().size())]
    # Spark's own file index names files as %-encoded URIs; Delta's names them as they are
    spark_reads = sorted(f if fmt == DELTA_FORMAT else decode_hadoop_uri(f)
                         for f in df.inputFiles())
    overlap = _overlap(roots)
    if overlap:  # Spark reads the files under both: inputFiles() names each once
        return Decision(None, f"its root paths overlap ({overlap[1]} is inside {overlap[0]}), "
                              "so Spark reads some files more than once")
    if fmt == DELTA_FORMAT:  # Spark with Delta Lake (Databricks): its version's files
        return _delta_scan(roots[0], _scanned_version(relation.location()), spark_reads,
                           columns, kinds, types, reader, split_column)
    _warn_delta(roots)
    if len(roots) == 1 and not parts and fmt != DELTA_FORMAT:
        whole = _whole_folder(roots[0], spark_reads)
        if whole is not None:
            return whole
    return _listed(roots, spark_reads, parts, {n: SPARK_TYPES[types[n]] for n in parts},
                   reader)


def _delta_frame(url: str, version: Table, columns: list[str], kinds: dict[str, str],
                 types: dict[str, str], reader: str, split_column: str | None) -> Decision:
    """The Decision for a Delta or Iceberg table's ``version`` (its files named one by one,
    (with their deletion vectors, which the ranks apply)."""
    for name in columns:
        if kinds[name] not in IN_PLACE_KINDS or "decimal" in types[name]:
            return Decision(None, f"column {name!r} ({types[name]}) needs Spark to convert it")
    if split_column is not None and split_column in version.columns:
        return Decision(None, f"the validation column {split_column!r} is a partition column")
    if reader == "petastorm":
        return Decision(None, "reader='petastorm' reads one folder, and a Delta or Iceberg "
                              "table's version is its files named one by one")
    dvs = len(version.masks.by_file) if version.masks else 0
    return Decision(url, f"the Delta or Iceberg table's version, its {len(version.paths)} "
                         "file(s) named by its log or manifests" +
                    (f", {dvs} with a deletion vector the ranks apply" if dvs else ""),
                    version)


def _scanned_version(location: Any) -> int | None:
    """The table version a Delta Lake file index scans, where its API tells (None where
    not: Delta Lake's classes differ between releases)."""
    for attempt in (lambda: location.version(), lambda: location.tableVersion(),
                    lambda: location.snapshotAtAnalysis().version(),
                    lambda: location.getSnapshot().version()):
        try:
            return int(attempt())
        except Exception:  # noqa: BLE001 - not this release's API: try the next
            continue
    return None


def _delta_scan(root: str, version: int | None, spark_reads: list[str], columns: list[str],
                kinds: dict[str, str], types: dict[str, str], reader: str,
                split_column: str | None) -> Decision:
    """A scan by Spark with Delta Lake (Databricks): read in place where the table's log
    can be read here at the version scanned and names the files Spark reads, with the
    deletion vectors of that version; materialized otherwise, saying why
    (:func:`sparkddl.tables.delta.scan_table`). Not tested here: no Delta Lake jar is
    reachable from the tests."""
    scanned, why = scan_table(root, version)
    if scanned is None:
        return Decision(None, why)
    if sorted(_key(p) for p in scanned.paths) != sorted(_key(f) for f in spark_reads):
        return Decision(None, "it scans other files of the Delta table than its log names here "
                              "(time travel, or a commit since)")
    return _delta_frame(Store.from_uri(root).url(), scanned, columns, kinds, types, reader,
                        split_column)


def _overlap(roots: list[str]) -> tuple[str, str] | None:
    """Two root paths of which one is (inside) the other, if any."""
    keys = [_key(r).rstrip("/") for r in roots]
    for i, outer in enumerate(keys):
        for j, inner in enumerate(keys):
            if i != j and (inner == outer and i < j or inner.startswith(outer + "/")):
                return roots[i], roots[j]
    return None


def _warn_delta(roots: list[str]) -> None:
    """A Parquet scan of a Delta table's folder reads the files of every version: say so (the
    rows are those of the DataFrame as given, as Spark reads them)."""
    for root in roots:
        if is_delta(root):
            log.warning("data: %s is a Delta Lake table read as plain Parquet: Spark reads the "
                        "files of every version, deleted and overwritten rows included; train "
                        "on its current version with sparkddl.read_delta(spark, url) or "
                        "spark.read.format('delta')", root)


def _whole_folder(root: str, spark_reads: list[str]) -> Decision | None:
    """The Decision to read the folder ``root`` (the readers list it), when Spark reads
    exactly its data files; None when it reads others (then the files are listed)."""
    store = Store.from_uri(root)
    try:
        listed = data_files(store.filesystem(), store.fs_path(store.url()))
    except Exception:  # noqa: BLE001 - e.g. the root is a file: list the files Spark reads
        return None
    if {_key(f.path) for f in listed} != {_key(p) for p in spark_reads}:
        return None
    return Decision(store.url(), "a plain Parquet scan of numeric columns")


def _listed(roots: list[str], spark_reads: list[str], parts: list[str], types: dict[str, str],
            reader: str) -> Decision:
    """The Decision to read the files Spark reads, named one by one (several roots, a list
    of files, a partitioned table whose partition columns are used)."""
    what = f"{len(roots)} root path(s)" + (f" and partition column(s) {', '.join(parts)}"
                                          if parts else "")
    if reader == "petastorm":
        return Decision(None, f"reader='petastorm' reads one folder, and the scan has {what}")
    if not spark_reads:
        return Decision(None, "Spark reads no files for it")
    stores = [Store.from_uri(f) for f in spark_reads]
    homes = {s.root.split("://", 1)[0] + "://" + split_uri(s.root)[1] for s in stores}
    if len(homes) != 1:
        return Decision(None, f"its files are on {len(homes)} filesystems "
                              f"({', '.join(sorted(homes))}), not one")
    home = homes.pop()
    paths = [s.fs_path(s.url()) for s in stores]
    fs_root = posixpath.commonpath(paths) if len(paths) > 1 else posixpath.dirname(paths[0])
    if fs_root in paths:  # one file
        fs_root = posixpath.dirname(fs_root)
    url = Store.from_uri(home + ("" if fs_root.startswith("/") else "/") + fs_root).url()
    try:
        named = hive_table("", paths, parts, types)
    except DataError as exc:
        return Decision(None, str(exc))
    return Decision(url, f"the {len(paths)} Parquet file(s) Spark reads, named one by one: "
                         f"{what}", named)


def _name(obj: Any) -> str:
    return str(obj.getClass().getSimpleName())


def _key(path: str) -> str:
    """A file named by Spark (``file:/a/b``, ``s3a://bucket/k``) or by a pyarrow filesystem
    (``/a/b``, ``bucket/k``), compared without its scheme."""
    scheme, netloc, rest = split_uri(path)
    return (netloc + rest if scheme else path).lstrip("/")
