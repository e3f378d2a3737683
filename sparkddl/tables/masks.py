"""Rows deleted from a data file without rewriting it, applied as row masks by the reader of
that file: two kinds, one interface (:class:`RowMask`), kept by data file in
:class:`RowMasks`.

**Delta deletion vectors** (:class:`DeletionVector`). The Delta log's ``add`` action of a file
may carry a ``deletionVector`` descriptor: where the bitmap of deleted row indexes (positions
in the file, counted across its row groups in file order) is kept, its size in bytes and how
many rows it deletes (the bitmap's format: :mod:`sparkddl.tables.roaring`). It is kept

- ``i``: inline, Z85-encoded in the descriptor itself;
- ``u``: in ``<table>/<prefix>/deletion_vector_<uuid>.bin``, the descriptor giving the prefix
  and the UUID (its last 20 characters, Z85), and the offset of the bitmap in the file;
- ``p``: in the file at an absolute path, at an offset.

A deletion-vector file starts with a version byte (1); at each bitmap's offset come its size
(4 bytes, big-endian), the bitmap, and the CRC-32 of the bitmap (4 bytes, big-endian). One
file may hold the bitmaps of many data files.

**Iceberg positional delete files** (:class:`PositionDeletes`): Parquet files of
``file_path`` and ``pos`` (a deleted row's position in the data file ``file_path``), one file
perhaps for many data files, a data file perhaps deleted from by several. The rank reading a
data file reads the rows of its delete files that name it (as the manifests write its path).

Nothing here builds a dense mask of a whole file: a mask is decoded to the sorted indexes it
deletes (4 bytes a deleted row), and a reader asks for the deleted rows of one row group at a
time. A rank reads the masks of the files it reads, and no others. Every error reading one is
a DataError naming the data file and the mask's own file.
"""
from __future__ import annotations

import posixpath
import struct
import threading
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

import numpy as np

from sparkddl.errors import DataError
from sparkddl.tables.paths import fs_path
from sparkddl.tables.roaring import decode, z85_decode

# bytes of decoded masks a process keeps (4 a deleted row): a rank reads its files' again
# every epoch, in a seeded order of row groups
_CACHED_BYTES = 64 << 20


class RowMask(Protocol):
    """Rows deleted from one data file."""

    @property
    def key(self) -> str:
        """The mask's identity in the table's metadata (for fingerprints)."""
        ...

    def describe(self) -> str:
        """The mask as an error names it ("its deletion vector in ... at offset ...")."""
        ...

    def deleted_rows(self, filesystem: Any, data_file: str, rows: int) -> np.ndarray:
        """The sorted unique row indexes (uint64) deleted from ``data_file`` of ``rows``
        rows; DataError naming both files where the mask cannot be read or does not fit."""
        ...


@dataclass(frozen=True)
class DeletionVector:
    """The deletion-vector descriptor of one data file, as the Delta log gives it, with the
    file that holds the bitmap resolved to a path of the table's filesystem (``u``, ``p``)."""

    storage: str  # "i", "u" or "p"
    where: str  # pathOrInlineDv as logged
    offset: int | None  # of the bitmap's size field in its file (``u``, ``p``)
    size: int  # sizeInBytes of the bitmap
    cardinality: int  # rows deleted
    file: str = ""  # the bitmap's file in the table's filesystem (``u``, ``p``)

    @property
    def key(self) -> str:
        return f"{self.storage}{self.where}" + (f"@{self.offset}" if self.offset is not None
                                               else "")

    def describe(self) -> str:
        if self.storage == "i":
            return f"its inline deletion vector ({self.size} bytes)"
        return f"its deletion vector in {self.file} at offset {self.offset}"

    def deleted_rows(self, filesystem: Any, data_file: str, rows: int) -> np.ndarray:
        """Checked against the descriptor: size, CRC-32, cardinality, every index inside
        the file."""
        where = f"{self.describe()}, for the data file {data_file}"
        try:
            deleted = decode(_bitmap(self, filesystem))
        except FileNotFoundError:
            raise DataError(f"{where}: the deletion vector's file is gone (vacuumed or moved); "
                            "the table is damaged, or changed while it was read: read it "
                            "again, or train on a fixed version") from None
        except (ValueError, struct.error, OSError) as exc:
            raise DataError(f"{where} cannot be read: {exc}; the table is damaged (read it "
                            "through Spark with Delta Lake to check it)") from None
        if len(deleted) != self.cardinality:
            raise DataError(f"{where} deletes {len(deleted)} rows where the log says "
                            f"{self.cardinality}; the table is damaged")
        if len(deleted) and int(deleted[-1]) >= rows:
            raise DataError(f"{where} deletes row {int(deleted[-1])}, beyond the file's {rows} "
                            "rows; the deletion vector is not this file's (the table is "
                            "damaged)")
        return deleted


@dataclass(frozen=True)
class PositionDeletes:
    """An Iceberg positional delete file that applies to one data file."""

    file: str  # the delete file, a path of the table's filesystem
    data_file: str  # the data file as the delete file names it (its manifest's path)
    size: int  # bytes of the delete file
    records: int  # its rows, of all its data files

    @property
    def key(self) -> str:
        return f"iceberg-positions:{self.file}@{self.size}"

    def describe(self) -> str:
        return f"its Iceberg positional delete file {self.file}"

    def deleted_rows(self, filesystem: Any, data_file: str, rows: int) -> np.ndarray:
        return positions(self, filesystem, f"{self.describe()}, for the data file {data_file}",
                         rows)


# one data file's mask: a deletion vector, or the positional delete files that apply to it
FileMask = DeletionVector | tuple[PositionDeletes, ...]


def descriptor(raw: dict[str, Any], root: str, data_file: str) -> DeletionVector:
    """The :class:`DeletionVector` of a log's ``deletionVector`` object; ``root`` is the
    table's folder in its filesystem. DataError naming the data file where the descriptor
    is malformed."""
    try:
        storage, where = str(raw["storageType"]), str(raw["pathOrInlineDv"])
        size, cardinality = int(raw["sizeInBytes"]), int(raw["cardinality"])
        offset = None if raw.get("offset") is None else int(raw["offset"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"the Delta log's deletion vector of {data_file} is malformed ({exc!r} "
                        f"in {raw}); the table's log is damaged") from None
    if storage == "i":
        return DeletionVector(storage, where, None, size, cardinality)
    if storage == "u":
        if len(where) < 20:
            raise DataError(f"the Delta log's deletion vector of {data_file} names no UUID "
                            f"({where!r}); the table's log is damaged")
        prefix, encoded = where[:-20], where[-20:]
        try:
            name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded, 16))}.bin"
        except ValueError as exc:
            raise DataError(f"the Delta log's deletion vector of {data_file} names its file by "
                            f"a UUID that is not Z85 ({exc}); the table's log is damaged (read "
                            "the table through Spark with Delta Lake)") from None
        file = posixpath.join(root, prefix, name) if prefix else posixpath.join(root, name)
    elif storage == "p":
        file = fs_path(where)
    else:
        raise DataError(f"the deletion vector of {data_file} has storage type {storage!r}, "
                        "which this version of sparkddl does not know (the protocol has 'i', "
                        "'u' and 'p'); read the table through Spark with Delta Lake")
    return DeletionVector(storage, where, offset or 0, size, cardinality, file)


def positions(dv: PositionDeletes, filesystem: Any, where: str, rows: int) -> np.ndarray:
    """The sorted unique positions the Iceberg positional delete file ``dv.file`` deletes
    from the data file it names ``dv.data_file`` (its other data files' rows skipped: by their
    row groups' statistics where the file has them), each checked to be below ``rows``."""
    import pyarrow as pa
    import pyarrow.compute
    import pyarrow.parquet as pq

    pc: Any = pyarrow.compute  # its functions are made at import: no stubs name them

    found = []
    try:
        with filesystem.open_input_file(dv.file) as f:
            parquet = pq.ParquetFile(f)
            names = parquet.schema_arrow.names
            if "file_path" not in names or "pos" not in names:
                raise ValueError(f"it has columns {names}, not file_path and pos")
            leaves = [parquet.schema.column(i).path for i in range(len(parquet.schema))]
            column = leaves.index("file_path")  # a leaf's index: statistics are by leaf
            for index in range(parquet.metadata.num_row_groups):
                stats = parquet.metadata.row_group(index).column(column).statistics
                if stats is not None and stats.has_min_max and isinstance(stats.min, str) \
                        and not stats.min <= dv.data_file <= stats.max:
                    continue  # the delete file is sorted by file_path: another file's rows
                part = parquet.read_row_group(index, columns=["file_path", "pos"])
                if part["file_path"].null_count or part["pos"].null_count:
                    raise ValueError("it has null file_path or pos values, which the Iceberg "
                                     "spec requires")
                found.append(part["pos"].filter(pc.equal(part["file_path"], dv.data_file))
                             .cast(pa.int64()).to_numpy(zero_copy_only=False))
    except FileNotFoundError:
        raise DataError(f"{where}: the delete file is gone (expired or moved); the table is "
                        "damaged, or changed while it was read: read it again, or train on a "
                        "fixed snapshot") from None
    except (ValueError, TypeError, KeyError, OSError, pa.ArrowException) as exc:
        raise DataError(f"{where} cannot be read: {exc}; the table is damaged (read it "
                        "through Spark with Iceberg's runtime jar to check it)") from None
    deleted = np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)
    if len(deleted) and (deleted[0] < 0 or deleted[-1] >= rows):
        bad = int(deleted[0] if deleted[0] < 0 else deleted[-1])
        raise DataError(f"{where} deletes row {bad}, beyond the file's {rows} rows; the "
                        "delete file does not fit the data file (the table is damaged)")
    return deleted.astype(np.uint64)


def _bitmap(dv: DeletionVector, filesystem: Any) -> bytes:
    """The bitmap's bytes, checked against the descriptor (ValueError otherwise)."""
    if dv.storage == "i":
        return z85_decode(dv.where, dv.size)
    with filesystem.open_input_file(dv.file) as f:
        if dv.offset == 0 or f.read_at(1, 0) != b"\x01":
            if dv.offset == 0:
                raise ValueError("its offset is 0, the file's version byte")
            raise ValueError(f"the file's version byte is {f.read_at(1, 0)!r}, not 1")
        offset = dv.offset or 0  # 0 refused above: a u or p descriptor has one
        head = f.read_at(4, offset)
        if len(head) < 4:
            raise ValueError(f"offset {dv.offset} is past the end of the file")
        (size,) = struct.unpack(">i", head)
        if size != dv.size:
            raise ValueError(f"the file gives the bitmap {size} bytes, the log {dv.size}")
        body = f.read_at(size + 4, offset + 4)
    if len(body) < size + 4:
        raise ValueError("the file ends inside the bitmap")
    data, (crc,) = body[:size], struct.unpack(">I", body[size:])
    if zlib.crc32(data) != crc:
        raise ValueError(f"its CRC-32 is {zlib.crc32(data):#010x}, the file says {crc:#010x}")
    return data


class RowMasks:
    """The row masks of a table's files, by data file (a deletion vector, or the Iceberg
    delete files that apply to it); decoded on first use, a few kept per process (the files
    a rank reads, read again every epoch)."""

    def __init__(self, by_file: Mapping[str, FileMask]):
        self.by_file = dict(by_file)
        self._decoded: OrderedDict[tuple[str, Any], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # the reader's threads share it

    def __bool__(self) -> bool:
        return bool(self.by_file)

    def deleted(self, filesystem: Any, path: str, rows: int) -> np.ndarray | None:
        """The sorted row indexes deleted from the data file ``path`` (``rows`` rows), or
        None where it has no deletion vector."""
        mask = self.by_file.get(path)
        if mask is None:
            return None
        key = (path, mask)
        with self._lock:
            found = self._decoded.get(key)
            if found is not None:
                self._decoded.move_to_end(key)
                return found
        # outside the lock: reads, maybe remote
        if isinstance(mask, DeletionVector):
            found = mask.deleted_rows(filesystem, path, rows)
        else:
            parts = [m.deleted_rows(filesystem, path, rows) for m in mask]
            found = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)
        if rows <= 1 << 32:  # 4 bytes a deleted row where the file's indexes fit
            found = found.astype(np.uint32)
        with self._lock:
            self._decoded[key] = found
            held = sum(a.nbytes for a in self._decoded.values())
            while held > _CACHED_BYTES and len(self._decoded) > 1:
                held -= self._decoded.popitem(last=False)[1].nbytes
        return found

    def keep(self, filesystem: Any, path: str, file_rows: int, first: int, count: int
             ) -> np.ndarray | None:
        """True for the rows ``first..first+count`` of ``path`` that are not deleted; None
        where none of them is."""
        deleted = self.deleted(filesystem, path, file_rows)
        if deleted is None:
            return None
        lo, hi = np.searchsorted(deleted, np.array([first, first + count], deleted.dtype)
                                 if first + count <= np.iinfo(deleted.dtype).max else
                                 [first, first + count])
        if lo == hi:
            return None
        mask = np.ones(count, bool)
        mask[deleted[lo:hi].astype(np.int64) - first] = False
        return mask

    def __getstate__(self) -> dict[str, Any]:  # shipped in plans: descriptors, never bitmaps
        return {"by_file": self.by_file}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["by_file"])  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowMasks) and other.by_file == self.by_file

    def __hash__(self) -> int:
        return hash(tuple(map(tuple, self.identity())))

    def identity(self) -> list[list[str]]:
        """(data file, the keys of its masks...) of every file, sorted."""
        return sorted([p, *keys(m)] for p, m in self.by_file.items())


def keys(mask: FileMask) -> list[str]:
    """The keys of one data file's mask or masks."""
    return [mask.key] if isinstance(mask, DeletionVector) else [m.key for m in mask]
