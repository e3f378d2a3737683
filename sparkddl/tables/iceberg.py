"""Apache Iceberg tables read in place: the data files of the table's current snapshot, as
its manifests name them (pyiceberg, the ``iceberg`` extra, plans the scan; no Spark jar),
never every Parquet file under its location (which holds the files of every snapshot until
they are expired).

What is read in place and what is refused, file by file:

- identity-partition values become partition columns of the :class:`Table` (numbers,
  booleans and strings, where no file's value is null; the files hold those columns too, as
  Iceberg writes them);
- positional delete files (Parquet, as Spark and Flink write them with merge-on-read;
  pyiceberg's own ``delete`` rewrites files) are applied as row masks, like Delta's deletion
  vectors (:mod:`sparkddl.tables.masks`): the Table names each data file's delete files,
  and the rank that reads a data file reads the positions they delete from it;
- equality delete files, and deletion vectors in Puffin files (format version 3), are
  refused, saying why;
- Iceberg matches a file's columns to the table's by field id, a reader of Parquet by name: a
  file whose column has another name than the table's column of the same id (a rename), or a
  table column's name but another id (a column dropped and added again), is refused, naming
  the column, instead of read as the wrong column.
"""
from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any

from sparkddl.errors import DataError
from sparkddl.store import Store
from sparkddl.store.store import split_uri
from sparkddl.tables.frames import union, without_deleted
from sparkddl.tables.handed import hand_over
from sparkddl.tables.masks import PositionDeletes, RowMasks
from sparkddl.tables.parquet import parquet_file
from sparkddl.tables.table import Table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FIELD_ID = b"PARQUET:field_id"
# Iceberg's primitive types read in place as partition columns, as Arrow type names
ARROW_TYPES = {"int": "int32", "long": "int64", "float": "float32", "double": "float64",
               "boolean": "bool", "string": "string"}
_MERGE_ON_READ = ("sparkddl applies positional delete files in Parquet only: read the table "
                  "through Spark (with Iceberg's runtime jar, spark.table(...)) and it is "
                  "materialized, or rewrite its data files (Iceberg's rewrite_data_files)")


def iceberg_table(table: Any) -> Table:
    """The data files of the current snapshot of the pyiceberg ``table`` (filesystem paths,
    sorted) with its identity-partition values and its positional delete files (descriptors:
    the ranks read them). DataError for equality delete files, delete files not in Parquet,
    and files whose columns are not the table's by name (renames)."""
    name = _name(table)
    try:
        tasks = list(table.scan().plan_files())
    except FileNotFoundError as exc:
        raise DataError(f"a metadata file of the Iceberg table {name} is gone ({exc}): a "
                        "manifest or manifest list deleted under the table (expired or moved); "
                        "the table is damaged, or changed while it was read: load it again, or "
                        "read it through Spark with Iceberg's runtime jar") from None
    except (OSError, EOFError) as exc:
        raise DataError(f"a metadata file of the Iceberg table {name} cannot be read "
                        f"({type(exc).__name__}: {exc}); it is truncated or damaged: read the "
                        "table through Spark with Iceberg's runtime jar to check it") from None
    except ValueError as exc:
        if "equality delete" not in str(exc):
            raise DataError(f"the scan of the Iceberg table {name} cannot be planned here "
                            f"({exc}); read it through Spark with Iceberg's runtime jar") from None
        raise DataError(f"the Iceberg table {name} has equality delete files, which "
                        f"sparkddl does not apply; {_MERGE_ON_READ}") from None
    stores = {task.file.file_path: Store.from_uri(task.file.file_path) for task in tasks}
    paths = {uri: s.fs_path(s.url()) for uri, s in stores.items()}
    order = sorted(tasks, key=lambda t: paths[t.file.file_path])
    columns, types, values = _partitions(table, [t.file for t in order])
    vectors = {paths[t.file.file_path]: _delete_files(t, name) for t in order if t.delete_files}
    # each file's row count in its manifest, checked against its footer: positions of a file
    # rewritten under the same name would name other rows
    snapshot = Table(tuple(paths[t.file.file_path] for t in order), columns, types, values,
                      RowMasks(vectors) if vectors else None,
                      records=tuple(int(t.file.record_count) for t in order))
    if stores:
        check_columns(table, next(iter(stores.values())).filesystem(), snapshot.paths, name)
    return snapshot


def _delete_files(task: Any, name: str) -> tuple[PositionDeletes, ...]:
    """The descriptors of the positional delete files of a scan task's data file (sorted by
    path); DataError for an equality delete file or one not in Parquet."""
    from pyiceberg.manifest import DataFileContent, FileFormat

    found = {}
    for d in task.delete_files:
        if d.content != DataFileContent.POSITION_DELETES:
            kind = str(d.content.name).lower().replace("_", " ")
            raise DataError(f"the Iceberg table {name} has {kind} file {d.file_path} for "
                            f"{task.file.file_path}; {_MERGE_ON_READ}")
        if d.file_format != FileFormat.PARQUET:
            raise DataError(f"the Iceberg table {name} has a positional delete file "
                            f"{d.file_path} in {d.file_format.name} for {task.file.file_path} "
                            f"(deletion vectors in Puffin files, or ORC); {_MERGE_ON_READ}")
        store = Store.from_uri(d.file_path)
        path = store.fs_path(store.url())
        found[path] = PositionDeletes(path, task.file.file_path, int(d.file_size_in_bytes),
                                      int(d.record_count))
    return tuple(found[p] for p in sorted(found))


def read_iceberg(spark: SparkSession, table_or_identifier: Any, catalog: Any = None
                 ) -> DataFrame:
    """A DataFrame of the current snapshot of an Iceberg table that sparkddl reads in place,
    for sessions without Iceberg's Spark jar: Spark reads the files the table's manifests
    name, not every Parquet file under its location; files with positional delete files
    lose their deleted rows (an anti join on ``_metadata.row_index``, as for
    ``read_delta``), and given to a fit as it is, each rank applies the delete files of the
    files it reads.

    Args:
        spark: the SparkSession.
        table_or_identifier: a pyiceberg ``Table``, or its identifier (``"db.table"``) in
            ``catalog``.
        catalog: a pyiceberg ``Catalog``, or the name of one pyiceberg's configuration
            (``~/.pyiceberg.yaml``, ``PYICEBERG_CATALOG__*``) defines; None for its default.

    Raises:
        DataError: no data files, equality deletes or renamed columns.
    """
    table = _table(table_or_identifier, catalog)
    snapshot = iceberg_table(table)
    if not snapshot.paths:
        raise DataError(f"the Iceberg table {_name(table)} has no data files in its current "
                        "snapshot; append rows to it first")
    url = table_url(table, snapshot)
    store = Store.from_uri(url)
    root = store.fs_path(store.url())
    # no basePath: Iceberg's files hold their identity-partition columns, and Spark's
    # inference from the folder names (types, escaping) could differ from the table's values
    deleted = snapshot.masks.by_file if snapshot.masks else {}
    plain = [store.spark_url(posixpath.relpath(p, root)) for p in snapshot.paths
             if p not in deleted]
    frames = [spark.read.parquet(*plain)] if plain else []
    if deleted:
        frames.append(without_deleted(
            spark, store.filesystem(), snapshot,
            lambda path, extra: spark.read.parquet(
                store.spark_url(posixpath.relpath(path, root))).select("*", *extra)))
    frame = union(frames)
    missing = [c for c in snapshot.columns if c not in frame.columns]
    if missing:
        raise DataError(f"the data files of the Iceberg table {_name(table)} do not hold its "
                        f"partition column {missing[0]!r} (files imported from a Hive table?); "
                        "read the table through Spark with Iceberg's runtime jar")
    return hand_over(frame, url, snapshot)  # what a fit reads in place


def table_url(table: Any, snapshot: Table) -> str:
    """The table's location, or the folder above it that holds every file of ``snapshot``
    (files added from elsewhere by ``add_files``)."""
    url = Store.from_uri(table.location()).url()
    while True:
        store = Store.from_uri(url)
        root = store.fs_path(store.url()).rstrip("/") + "/"
        if all(p.startswith(root) for p in snapshot.paths):
            return store.url()
        scheme, netloc, path = split_uri(url)
        if posixpath.dirname(path.rstrip("/")) in ("", "/"):
            raise DataError(f"the data files of the Iceberg table {_name(table)} are in no "
                            f"folder below {scheme}://{netloc}/ with its location "
                            f"{table.location()}; read it through Spark with Iceberg's "
                            "runtime jar")
        url = f"{scheme}://{netloc}{posixpath.dirname(path.rstrip('/'))}"


def check_columns(table: Any, filesystem: Any, paths: tuple[str, ...], name: str) -> None:
    """Every file's columns are the table's current columns of the same field id (the
    file's ids, or the table's name mapping for files written without ids): DataError naming
    the first column that is not."""
    schema = table.schema()
    mapping = _name_mapping(table)
    for path in paths:
        with parquet_file(filesystem, path) as f:
            fields = list(f.schema_arrow)
        for field in fields:
            raw = (field.metadata or {}).get(FIELD_ID)
            field_id = int(raw) if raw is not None else mapping.get(field.name)
            if field_id is None:
                continue  # neither id nor mapping: Iceberg matches it by name too
            current = _field(schema, field_id)
            if current is not None and current.name != field.name:
                raise DataError(f"column {field.name!r} of {path} is the Iceberg table {name}'s "
                                f"column {current.name!r} (field id {field_id}), renamed since "
                                "the file was written; a Parquet reader matches columns by "
                                "name, so the table is not read in place: rewrite its files "
                                "(or read it through Spark with Iceberg's runtime jar)")
            if current is None and field.name in schema.column_names:
                raise DataError(f"column {field.name!r} of {path} (field id {field_id}) is not "
                                f"the Iceberg table {name}'s column {field.name!r} (it was "
                                "dropped and another added under its name); a Parquet reader "
                                "would read the old values: rewrite the table's files")


def _partitions(table: Any, files: list[Any]
                ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[Any, ...], ...]]:
    """The identity-partition columns of every file's spec (of a type read in place, not
    null for any file: those are left to the files, which hold them), their Arrow types and
    each file's values."""
    from pyiceberg.transforms import IdentityTransform

    specs, schema = table.specs(), table.schema()
    positions = [{f.source_id: i for i, f in enumerate(specs[data_file.spec_id].fields)
                  if isinstance(f.transform, IdentityTransform)} for data_file in files]
    fields = [_field(schema, i) for i in (positions[0] if positions else {})
              if all(i in p for p in positions)]
    fields = [f for f in fields if f is not None and str(f.field_type) in ARROW_TYPES and
              all(d.partition[p[f.field_id]] is not None for d, p in zip(files, positions))]
    if not fields:
        return (), (), ()
    return (tuple(f.name for f in fields), tuple(ARROW_TYPES[str(f.field_type)] for f in fields),
            tuple(tuple(d.partition[p[f.field_id]] for f in fields)
                  for d, p in zip(files, positions)))


def _field(schema: Any, field_id: int) -> Any:
    """The top-level field ``field_id`` of ``schema``, or None."""
    return next((f for f in schema.fields if f.field_id == field_id), None)


def _name_mapping(table: Any) -> dict[str, int]:
    """Top-level column names of files without field ids -> field ids, from the table's
    ``schema.name-mapping.default`` (what ``add_files`` sets)."""
    mapping = table.name_mapping()
    if mapping is None:
        return {}
    return {n: field.field_id for field in mapping for n in field.names}


def _table(table_or_identifier: Any, catalog: Any) -> Any:
    if not isinstance(table_or_identifier, str):
        return table_or_identifier
    try:
        from pyiceberg.catalog import load_catalog
    except ImportError:
        raise DataError("reading an Iceberg table needs the pyiceberg package (pip install "
                        "pyiceberg)") from None
    if catalog is None or isinstance(catalog, str):
        catalog = load_catalog(catalog)
    return catalog.load_table(table_or_identifier)


def _name(table: Any) -> str:
    return ".".join(table.name()) if hasattr(table, "name") else str(table)
