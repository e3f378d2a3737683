"""Delta Lake tables given by their folder, read in place: the files of the table's current
version, named by its log, never every Parquet file in the folder (which holds the files
of every version until they are vacuumed).

The log is read with the ``deltalake`` package (the ``delta`` extra; no Spark jar), and
replayed here for what deltalake does not give: each file's deletion vector
(:mod:`sparkddl.tables.masks`), which the rank reading that file applies as a row mask.
Whether a table is read in place is decided by the reader features its protocol lists,
against an allow-list (:data:`READER_FEATURES`), never by a table property: a table with
deletion vectors enabled whose files carry none is read as plain files, and column mapping
is read by physical names. A feature not on the list is named in a DataError, and the table
is read by Spark with Delta Lake (``spark.read.format("delta").load(url)``) and materialized.
"""
from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from sparkddl.errors import DataError
from sparkddl.store import Store
from sparkddl.tables.delta_log import DELTA_LOG, column_mapping, damaged_commit, logged_vectors
from sparkddl.tables.frames import union, without_deleted
from sparkddl.tables.handed import hand_over
from sparkddl.tables.masks import RowMasks, descriptor
from sparkddl.tables.paths import fs_path
from sparkddl.tables.table import Table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# reader features of a Delta protocol that sparkddl applies reading the files itself;
# vacuumProtocolCheck only asks writers and vacuum to check the protocol first; timestamps
# without a time zone and variants are column types, which a fit refuses by name if it
# uses such a column (deltalake lists variantType on the tables it writes with features)
READER_FEATURES = frozenset({"columnMapping", "deletionVectors", "timestampNtz",
                             "v2Checkpoint", "vacuumProtocolCheck", "variantType",
                             "variantType-preview"})
MAPPING_MODES = ("none", "name", "id")


def is_delta(url: str) -> bool:
    """Whether the folder at ``url`` is a Delta table (it has a ``_delta_log``)."""
    store = Store.from_uri(url)
    try:
        return store.exists(store.url(DELTA_LOG))
    except Exception:  # noqa: BLE001 - a folder that cannot be looked into is not Delta here
        return False


def delta_table(url: str) -> Table | None:
    """The files of the current version of the Delta table at ``url`` with their partition
    values, deletion vectors and column mapping; None where ``url`` is not a
    Delta table. DataError where it cannot be read in place (no ``deltalake``, a reader
    feature sparkddl does not apply), saying what to do."""
    if not is_delta(url):
        return None
    try:
        from deltalake import DeltaTable
    except ImportError:
        raise DataError(f"{url} is a Delta Lake table (it has {DELTA_LOG}/): its folder holds "
                        "the files of every version, so it is not read as plain Parquet. "
                        "Install the deltalake package (pip install deltalake) to read "
                        "its current version in place, or pass "
                        "spark.read.format('delta').load(url) from a session with Delta "
                        "Lake") from None
    store = Store.from_uri(url)
    try:
        table = open_table(DeltaTable, store)
    except Exception as exc:  # noqa: BLE001 - deltalake's errors name no file: find it
        raise unreadable_log(store, exc) from None
    why = not_in_place(table)
    if why:
        raise DataError(f"the Delta table at {url} {why}, which a reader of its Parquet files "
                        "alone cannot apply; pass spark.read.format('delta').load(url) from a "
                        "session with Delta Lake (it is then materialized once)")
    return table_of(store, table)


def unreadable_log(store: Store, exc: BaseException) -> DataError:
    """The DataError for a Delta log deltalake could not open, naming the log's file that
    is damaged where one of its commits does not parse (deltalake's message names none)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    where = damaged_commit(store)
    if where:
        return DataError(f"the Delta log's commit {where} cannot be read ({first}); "
                         "it is truncated or damaged: repair the table (read it through "
                         "Spark with Delta Lake), or restore the commit")
    return DataError(f"the Delta log of {store.url()} cannot be read here ({first}); read the "
                     "table through Spark with Delta Lake")


def read_delta(spark: SparkSession, url: str) -> DataFrame:
    """A DataFrame of the current version of the Delta table at ``url`` that sparkddl reads
    in place, for sessions without Delta Lake's Spark jar: Spark reads the files the log
    names (``basePath`` keeps the partition columns), not every Parquet file in the folder.

    Spark applies what its plain Parquet reader does not know, so the DataFrame is right
    wherever it goes: files with a deletion vector lose their deleted rows (an anti join on
    ``_metadata.row_index``), and with column mapping the files' columns are renamed to the
    table's, partition values added from the log. Given to a fit as it is, its files are
    read in place and each rank applies the deletion vectors of the files it reads.

    Args:
        spark: the SparkSession.
        url: the table's folder (any Store URL: path, ``file://``, ``s3://``, ...).

    Raises:
        DataError: not a Delta table, no data files, or a reader feature sparkddl does not
            apply.
    """
    version = delta_table(url)
    if version is None:
        raise DataError(f"{url} is not a Delta table (no {DELTA_LOG}/ in it); read a folder of "
                        "Parquet files with spark.read.parquet(url)")
    if not version.paths:
        raise DataError(f"the Delta table at {url} has no data files in its current version; "
                        "there is nothing to train on")
    store = Store.from_uri(url)
    return hand_over(_frame(spark, store, version), store.url(), version)


_SPARK_TYPES = {"int64": "bigint", "int32": "int", "int16": "smallint", "int8": "tinyint",
                "float64": "double", "float32": "float", "bool": "boolean", "string": "string"}


def _frame(spark: Any, store: Store, version: Table) -> Any:
    """Spark's reading of ``version``'s files as the table holds them."""
    from pyspark.sql import functions as F

    mapped = bool(version.renames)
    # without column mapping, partition values are folder names Spark reads (basePath);
    # with it, files lie under random prefixes and the log alone has the values
    reader = spark.read if mapped else spark.read.option("basePath", store.spark_url())
    deletes = version.masks.by_file if version.masks else {}
    index = {p: i for i, p in enumerate(version.paths)}

    def values(path: str) -> tuple:
        return version.values[index[path]] if mapped and version.columns else ()

    def columns(extra: list[Any], part: tuple) -> list[Any]:
        if not mapped:
            return ["*", *extra]
        data = [F.col(f"`{physical}`").alias(name) for name, physical, _ in version.renames
                if name not in version.columns]
        parts = [F.lit(v).cast(_SPARK_TYPES.get(t, "string")).alias(c)
                 for c, t, v in zip(version.columns, version.types, part)]
        return [*data, *parts, *extra]

    frames = []
    plain: dict[tuple, list[str]] = {}
    for path in version.paths:  # files without deletes: one scan per set of partition values
        if path not in deletes:
            plain.setdefault(values(path), []).append(_spark_url(store, path))
    for part, files in plain.items():
        frames.append(reader.parquet(*files).select(*columns([], part)))
    if deletes:
        frames.append(without_deleted(
            spark, store.filesystem(), version,
            lambda path, extra: reader.parquet(_spark_url(store, path)).select(
                *columns(extra, values(path)))))
    return union(frames)


def _spark_url(store: Store, path: str) -> str:
    """``path`` of the store's filesystem as a URL Spark opens."""
    root = store.fs_path(store.url())
    return store.spark_url(posixpath.relpath(path, root))


def open_table(delta_table: Any, store: Store) -> Any:
    """deltalake's ``DeltaTable`` of the table at the store's root (a local path for
    ``file://``, the URL otherwise)."""
    return delta_table(store.fs_path(store.url()) if store.scheme == "file" else store.url())


def scan_table(url: str, version: int | None) -> tuple[Table | None, str]:
    """For a scan of the Delta table at ``url`` by Spark with Delta Lake: its files at the
    scanned ``version`` (None: not told by Spark's plan), read in place, or None and why not
    (no ``deltalake`` here, a log it cannot read, a reader feature not applied, or a version
    it cannot tell while the table can have deletion vectors: the same files with other
    deletion vectors, after a DELETE or a RESTORE, are other rows). The log is opened once.
    Spark's side of it is not tested here: no Delta Lake jar is reachable from the tests."""
    try:
        from deltalake import DeltaTable
    except ImportError:
        return None, ("it scans a Delta table, which is read in place only where the deltalake "
                      "package (pip install deltalake) can read its log")
    store = Store.from_uri(url)
    try:
        table = open_table(DeltaTable, store)
        if version is not None and version != table.version():
            table.load_as_version(version)
    except Exception as exc:  # noqa: BLE001 - e.g. credentials only Spark holds: materialize
        return None, (f"its Delta log at {url} could not be read here"
                      f"{'' if version is None else f' at version {version}'} "
                      f"({type(exc).__name__})")
    why = not_in_place(table)
    if why:
        return None, f"the Delta table at {url} {why}"
    if version is None and "deletionVectors" in set(table.protocol().reader_features or ()):
        return None, ("the version of the Delta table the scan reads could not be told from "
                      "Spark's plan, and the table can have deletion vectors, so the same "
                      "files may hold other rows in the latest version")
    try:
        return table_of(store, table), ""
    except DataError as exc:
        return None, str(exc)


def not_in_place(table: Any) -> str:
    """Why the Delta ``table`` cannot be read from its files alone ("" where it can): a
    reader feature of its protocol that is not in :data:`READER_FEATURES`."""
    protocol = table.protocol()
    features = set(protocol.reader_features or ())
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode not in MAPPING_MODES:
        return f"uses column mapping in mode {mode!r}, which sparkddl does not know"
    if protocol.min_reader_version > 3:
        return f"needs a Delta reader of version {protocol.min_reader_version}"
    unknown = sorted(features - READER_FEATURES)
    if unknown:
        return (f"lists the reader feature(s) {', '.join(unknown)} in its protocol, which "
                "sparkddl does not apply")
    return ""


def table_of(store: Store, table: Any) -> Table:
    """The files of ``table``'s version (sorted by path) and each one's partition values."""
    actions = table.get_add_actions(flatten=True)
    names = list(actions.column_names)
    rel = [str(p) for p in actions.column("path").to_pylist()]
    vectors = logged_vectors(store, int(table.version()), rel)
    parts = [n[len("partition."):] for n in names if n.startswith("partition.")]
    values = list(zip(*[actions.column(f"partition.{c}").to_pylist() for c in parts])) \
        if parts else [()] * len(rel)
    root = store.fs_path(store.url())
    paths = [fs_path(p, root) for p in rel]
    order = sorted(range(len(paths)), key=paths.__getitem__)
    types = [_type(c, [v[i] for v in values], store.url()) for i, c in enumerate(parts)]
    deletes = {paths[i]: descriptor(raw, root, paths[i])
               for i in range(len(rel)) if (raw := vectors.get(unquote(rel[i])))}
    records: list[Any] = actions.column("num_records").to_pylist() \
        if "num_records" in names else [None] * len(rel)
    return Table(tuple(paths[i] for i in order), tuple(parts), tuple(types),
                   tuple(tuple(values[i]) for i in order) if parts else (),
                   RowMasks(deletes) if deletes else None, column_mapping(table),
                   tuple(-1 if records[i] is None else int(records[i]) for i in order))


def _type(column: str, values: list[Any], url: str) -> str:
    """The Arrow type of a partition column from its values (the log gives them typed)."""
    if any(v is None for v in values):
        raise DataError(f"partition column {column!r} of the Delta table at {url} is null for "
                        "some files; fill it, or pass spark.read.format('delta').load(url) "
                        "with the nulls filtered out")
    if all(isinstance(v, bool) for v in values):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int64"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "float64"
    return "string"
