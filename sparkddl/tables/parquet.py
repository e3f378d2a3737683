"""Parquet files of a table read in place: which files a folder holds (in the order
Petastorm and Spark list them), their row groups from the footers, and opening one with
every error naming it. The table formats (:mod:`sparkddl.tables.delta`,
:mod:`sparkddl.tables.iceberg`, hive folders in :mod:`sparkddl.tables.hive`) name their
files here too."""
from __future__ import annotations

import posixpath
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from sparkddl.errors import DataError
from sparkddl.tables.table import Table, as_table


@dataclass(frozen=True)
class RowGroup:
    path: str  # path inside the dataset's filesystem
    index: int  # row group number inside the file
    rows: int
    first: int = 0  # the file's row index of its first row
    file_rows: int = 0  # rows of the whole file


def data_files(filesystem: Any, table: Table | str) -> list[Any]:
    """``pyarrow.fs.FileInfo`` of the table's data files (a str: a folder's): of a folder,
    every data file under it, sorted by path as Petastorm orders them (names starting with
    '_' or '.' and checksum files are not data); else those of its named files that exist,
    in its order."""
    from pyarrow import fs as pafs

    table = as_table(table)
    if not table.folder:
        return [i for i in filesystem.get_file_info(list(table.paths))
                if i.type == pafs.FileType.File]
    root = table.folder
    infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    return sorted((i for i in infos if i.type == pafs.FileType.File and _is_data(root, i.path)),
                  key=lambda i: i.path)


def list_row_groups(filesystem: Any, table: Table | str) -> list[RowGroup]:
    """Every row group of the table (a str: of a folder) in Petastorm's order:
    :func:`data_files`, row groups in file order. Row groups without rows are kept:
    Petastorm counts them when it shards. FileNotFoundError naming the named files that
    are gone."""
    groups = []
    table = as_table(table)
    infos = data_files(filesystem, table)
    if len(infos) < len(table.paths):
        gone = sorted(set(table.paths) - {i.path for i in infos})
        raise FileNotFoundError(f"{len(gone)} listed data file(s) are gone: {', '.join(gone[:3])}")
    for info in infos:
        with parquet_file(filesystem, info.path) as f:
            meta = f.metadata
        first = 0
        for i in range(meta.num_row_groups):
            rows = meta.row_group(i).num_rows
            groups.append(RowGroup(info.path, i, rows, first, meta.num_rows))
            first += rows
    return groups


@contextmanager
def parquet_file(filesystem: Any, path: str, where: str = "", **options: Any) -> Iterator[Any]:
    """``pyarrow.parquet.ParquetFile`` of ``path``; opening it, reading its footer, or
    reading from it inside the ``with`` fails with a DataError naming the file (pyarrow's
    own errors, e.g. "Parquet magic bytes not found", name none)."""
    import pyarrow.parquet as pq

    try:
        with filesystem.open_input_file(path) as f:
            yield pq.ParquetFile(f, **options)
    except read_errors() as exc:
        raise unreadable(path, exc, where) from exc


def read_errors() -> tuple[type[BaseException], ...]:
    """What pyarrow raises for a file that is gone, truncated or not Parquet."""
    import pyarrow as pa
    return (OSError, pa.ArrowException)


def unreadable(path: str, exc: BaseException, where: str = "") -> DataError:
    """The DataError for a data file that is gone or cannot be read as Parquet; ``path``
    may be the dataset's URL where the reader did not say which of its files failed."""
    import pyarrow as pa
    prefix = f"{where}: " if where else ""
    if isinstance(exc, FileNotFoundError):
        return DataError(f"{prefix}the Parquet data file {path} is gone (deleted or moved "
                         "after it was listed); a table must not be changed while it is "
                         "trained on or scored: use a fixed version (a snapshot or copy), or "
                         "start again")
    if isinstance(exc, pa.ArrowException):
        return DataError(f"{prefix}the Parquet data file {path} cannot be read "
                         f"({type(exc).__name__}: {exc}); it is truncated, corrupted or not "
                         "Parquet. Repair or rewrite the table (e.g. read what is good and "
                         "write it again with Spark), or remove the file from its directory")
    return DataError(f"{prefix}reading the Parquet data file {path} failed "
                     f"({type(exc).__name__}: {exc}); check that its filesystem is reachable "
                     "and the file readable from here")


def _is_data(root: str, path: str) -> bool:
    """pyarrow's legacy dataset rule, which Petastorm inherits (and Spark's): no file whose
    name starts with '_' or '.' or is a checksum, under no folder whose name starts with '_'
    or '.' unless it is a partition folder (``_k=1``)."""
    *folders, name = posixpath.relpath(path, root).split("/")
    return not (name.startswith(("_", ".")) or name.endswith((".crc", "_$folder$")) or
                any(f.startswith(("_", ".")) and "=" not in f for f in folders))


def check_unchanged(filesystem: Any, root: str, files: tuple[tuple[str, int, int], ...],
                    where: str, table: Table | None = None) -> None:
    """DataError naming the data files of the table (of the folder ``root`` where none is
    given) that differ from ``files``, the (path, size, mtime_ns) recorded when the data was
    planned."""
    now = {f.path: (f.size, f.mtime_ns) for f in data_files(filesystem, table or root)}
    then = {path: (size, mtime) for path, size, mtime in files}
    changed = sorted(p for p in then.keys() & now.keys() if then[p] != now[p])
    gone, added = sorted(then.keys() - now.keys()), sorted(now.keys() - then.keys())
    if changed or gone or added:
        what = "; ".join(f"{label}: {', '.join(paths[:3])}" + (f" and {len(paths) - 3} more"
                                                               if len(paths) > 3 else "")
                         for label, paths in (("rewritten", changed), ("removed", gone),
                                              ("added", added)) if paths)
        raise DataError(f"{where}: the Parquet table at {root} changed after the fit planned it "
                        f"({what}); a table must not be written while it is trained on. Train on "
                        "a fixed version (a snapshot or copy), or start the fit again")
