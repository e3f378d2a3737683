"""Delta Lake tables given by their folder, read in place: the files of the table's current
version, named by its log, never every Parquet file in the folder (which holds the files
of every version until they are vacuumed).

The log is read with the ``deltalake`` package (``pip install 'sparkddl[delta]'``; no Spark
jar). A table whose reader must apply something the files alone do not say is not read in
place: deletion vectors (rows deleted without rewriting their file) and column mapping
(the files' column names are not the table's). Such a table is read by Spark with Delta
Lake (``spark.read.format("delta").load(url)``, as on Databricks) and materialized.
"""
from __future__ import annotations

import posixpath
from typing import Any
from urllib.parse import unquote, urlparse

from sparkddl.data.listing import Listing
from sparkddl.errors import DataError
from sparkddl.store import Store

DELTA_LOG = "_delta_log"


def is_delta(url: str) -> bool:
    """Whether the folder at ``url`` is a Delta table (it has a ``_delta_log``)."""
    store = Store.from_uri(url)
    try:
        return store.exists(store.url(DELTA_LOG))
    except Exception:  # noqa: BLE001 - a folder that cannot be looked into is not Delta here
        return False


def delta_listing(url: str) -> Listing | None:
    """The current version's files of the Delta table at ``url`` with their partition
    values; None where ``url`` is not a Delta table. DataError where it cannot be read in
    place (no ``deltalake``, deletion vectors, column mapping), saying what to do."""
    if not is_delta(url):
        return None
    try:
        from deltalake import DeltaTable
    except ImportError:
        raise DataError(f"{url} is a Delta Lake table (it has {DELTA_LOG}/): its folder holds "
                        "the files of every version, so it is not read as plain Parquet. "
                        "Install the deltalake package (pip install 'sparkddl[delta]') to read "
                        "its current version in place, or pass "
                        "spark.read.format('delta').load(url) from a session with Delta "
                        "Lake") from None
    store = Store.from_uri(url)
    table = open_table(DeltaTable, store)
    why = not_in_place(table)
    if why:
        raise DataError(f"the Delta table at {url} {why}, which a reader of its Parquet files "
                        "alone cannot apply; pass spark.read.format('delta').load(url) from a "
                        "session with Delta Lake (it is then materialized once)")
    return listing_of(store, table)


def read_delta(spark: Any, url: str) -> Any:
    """A DataFrame of the current version of the Delta table at ``url`` that sparkddl reads
    in place, for sessions without Delta Lake's Spark jar: Spark reads the files the log
    names (``basePath`` keeps the partition columns), not every Parquet file in the folder.
    Deletion vectors or column mapping: DataError, as for :func:`delta_listing`."""
    listing = delta_listing(url)
    if listing is None:
        raise DataError(f"{url} is not a Delta table (no {DELTA_LOG}/ in it); read a folder of "
                        "Parquet files with spark.read.parquet(url)")
    store = Store.from_uri(url)
    files = [_spark_url(store, p) for p in listing.paths]
    return spark.read.option("basePath", store.spark_url()).parquet(*files)


def _spark_url(store: Store, path: str) -> str:
    """``path`` of the store's filesystem as a URL Spark opens."""
    root = store.fs_path(store.url())
    return store.spark_url(posixpath.relpath(path, root))


def open_table(delta_table: Any, store: Store) -> Any:
    """deltalake's ``DeltaTable`` of the table at the store's root (a local path for
    ``file://``, the URL otherwise)."""
    return delta_table(store.fs_path(store.url()) if store.scheme == "file" else store.url())


def scan_reason(url: str) -> str:
    """Why a scan of the Delta table at ``url`` by Spark with Delta Lake is not read in place
    from the files ``inputFiles()`` lists for the scanned version ("" where it is):
    deletion vectors or column mapping enabled, or no ``deltalake`` to tell, or a log it
    cannot read here. Not tested here: no Delta Lake jar is reachable from the tests."""
    try:
        from deltalake import DeltaTable
    except ImportError:
        return ("it scans a Delta table, which is read in place only where the deltalake "
                "package (pip install 'sparkddl[delta]') can check its deletion vectors and "
                "column mapping")
    try:
        table = open_table(DeltaTable, Store.from_uri(url))
    except Exception as exc:  # noqa: BLE001 - e.g. credentials only Spark holds: materialize
        return f"its Delta log at {url} could not be read here ({type(exc).__name__})"
    why = not_in_place(table)
    return f"the Delta table at {url} {why}" if why else ""


def not_in_place(table: Any) -> str:
    """Why the Delta ``table`` cannot be read from its files alone ("" where it can)."""
    protocol = table.protocol()
    features = set(protocol.reader_features or ())
    if "deletionVectors" in features:
        return "has deletion vectors enabled (rows deleted without rewriting their files)"
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if "columnMapping" in features or mode != "none":
        return f"uses column mapping (mode {mode!r}: its files' column names are not the table's)"
    return ""


def listing_of(store: Store, table: Any) -> Listing:
    """The files of ``table``'s version (sorted by path) and each one's partition values."""
    actions = table.get_add_actions(flatten=True)
    names = list(actions.column_names)
    rel = [str(p) for p in actions.column("path").to_pylist()]
    parts = [n[len("partition."):] for n in names if n.startswith("partition.")]
    values = list(zip(*[actions.column(f"partition.{c}").to_pylist() for c in parts])) \
        if parts else [()] * len(rel)
    root = store.fs_path(store.url())
    paths = [_path(store, root, p) for p in rel]
    order = sorted(range(len(paths)), key=paths.__getitem__)
    types = [_type(c, [v[i] for v in values], store.url()) for i, c in enumerate(parts)]
    return Listing(tuple(paths[i] for i in order), tuple(parts), tuple(types),
                   tuple(tuple(values[i]) for i in order) if parts else ())


def _path(store: Store, root: str, path: str) -> str:
    """A file named by the Delta log (relative and URL-encoded, or an absolute URI) as a
    path in the store's filesystem."""
    if urlparse(path).scheme:  # an absolute URI, %-encoded as the protocol has it
        other = Store.from_uri(unquote(path))
        return other.fs_path(other.url())
    return posixpath.join(root, unquote(path))


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
