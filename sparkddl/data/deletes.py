"""Delta Lake deletion vectors: rows of a data file deleted without rewriting it, applied as
row masks by the reader of that file.

The Delta log's ``add`` action of a file may carry a ``deletionVector`` descriptor: where the
bitmap of deleted row indexes (positions in the file, counted across its row groups in file
order) is kept, its size in bytes and how many rows it deletes. The bitmap is a
"RoaringBitmapArray": the magic number 1681511377 (4 bytes, little-endian), the number of
32-bit bitmaps (8 bytes, little-endian), then for each its key, the high 32 bits of the
indexes it holds (4 bytes, little-endian), and a 32-bit Roaring bitmap in the portable
serialization every Roaring library writes. It is kept

- ``i``: inline, Z85-encoded in the descriptor itself;
- ``u``: in ``<table>/<prefix>/deletion_vector_<uuid>.bin``, the descriptor giving the prefix
  and the UUID (its last 20 characters, Z85), and the offset of the bitmap in the file;
- ``p``: in the file at an absolute path, at an offset.

A deletion-vector file starts with a version byte (1); at each bitmap's offset come its size
(4 bytes, big-endian), the bitmap, and the CRC-32 of the bitmap (4 bytes, big-endian). One
file may hold the bitmaps of many data files.

Iceberg's positional delete files (``storage`` "iceberg-positions") are Parquet files of
``file_path`` and ``pos`` (a deleted row's position in the data file ``file_path``), one file
perhaps for many data files, a data file perhaps deleted from by several. The rank reading a
data file reads the rows of its delete files that name it (as the manifests write its path).

Nothing here builds a dense mask of a whole file: a bitmap is decoded to the sorted indexes
it deletes (4 bytes a deleted row), and a reader asks for the deleted rows of one row group
at a time. A rank reads the bitmaps of the files it reads, and no others.
"""
from __future__ import annotations

import posixpath
import struct
import threading
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np

from sparkddl.errors import DataError

MAGIC_PORTABLE = 1681511377  # RoaringBitmapArray, portable serialization (the protocol's)
MAGIC_NATIVE = 1681511376  # the same, native serialization: not written to tables
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
# Roaring's portable serialization
_COOKIE_NO_RUNS = 12346
_COOKIE = 12347
_NO_OFFSET_THRESHOLD = 4
ICEBERG = "iceberg-positions"  # an Iceberg positional delete file
# bytes of decoded deletion vectors a process keeps (4 a deleted row): a rank reads its
# files' again every epoch, in a seeded order of row groups
_CACHED_BYTES = 64 << 20


@dataclass(frozen=True)
class DeletionVector:
    """The deletion-vector descriptor of one data file, as the Delta log gives it, with the
    file that holds the bitmap resolved to a path of the table's filesystem (``u``, ``p``);
    or an Iceberg positional delete file that applies to one (``iceberg-positions``)."""

    storage: str  # "i", "u", "p" or "iceberg-positions"
    where: str  # pathOrInlineDv as logged (Iceberg: the data file's path as deletes name it)
    offset: int | None  # of the bitmap's size field in its file (``u``, ``p``)
    size: int  # sizeInBytes: of the bitmap (Iceberg: of the delete file)
    cardinality: int  # rows deleted (Iceberg: the delete file's rows, of all its data files)
    file: str = ""  # the bitmap's (delete) file in the table's filesystem (``u``, ``p``)

    @property
    def key(self) -> str:
        """The descriptor's identity in the log (with the data file's path: an add's key)."""
        if self.storage == ICEBERG:
            return f"{self.storage}:{self.file}@{self.size}"
        return f"{self.storage}{self.where}" + (f"@{self.offset}" if self.offset is not None
                                               else "")

    def describe(self) -> str:
        if self.storage == ICEBERG:
            return f"its Iceberg positional delete file {self.file}"
        if self.storage == "i":
            return f"its inline deletion vector ({self.size} bytes)"
        return f"its deletion vector in {self.file} at offset {self.offset}"


def descriptor(raw: dict[str, Any], root: str, store: Any, data_file: str) -> DeletionVector:
    """The :class:`DeletionVector` of a log's ``deletionVector`` object; ``root`` is the
    table's folder in ``store``'s filesystem."""
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
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded, 16))}.bin"
        file = posixpath.join(root, prefix, name) if prefix else posixpath.join(root, name)
    elif storage == "p":
        if urlparse(where).scheme:
            other = type(store).from_uri(unquote(where))
            file = other.fs_path(other.url())
        else:
            file = unquote(where)
    else:
        raise DataError(f"the deletion vector of {data_file} has storage type {storage!r}, "
                        "which this version of sparkddl does not know (the protocol has 'i', "
                        "'u' and 'p'); read the table through Spark with Delta Lake")
    return DeletionVector(storage, where, offset or 0, size, cardinality, file)


def z85_decode(text: str, size: int | None = None) -> bytes:
    """Z85 text as bytes (the first ``size`` of them: Delta pads inline bitmaps to 4)."""
    if len(text) % 5:
        text = text + _Z85[0] * (5 - len(text) % 5)
    out = bytearray()
    try:
        for i in range(0, len(text), 5):
            value = 0
            for c in text[i:i + 5]:
                value = value * 85 + _Z85_VALUE[c]
            out += value.to_bytes(4, "big")
    except (KeyError, OverflowError):
        raise ValueError(f"not Z85 text: {text[:40]!r}") from None
    return bytes(out if size is None else out[:size])


def load(dv: DeletionVector, filesystem: Any, data_file: str, rows: int) -> np.ndarray:
    """The sorted row indexes ``dv`` deletes from ``data_file`` (of ``rows`` rows), checked
    against the descriptor: size, CRC-32, cardinality, every index inside the file.
    DataError naming the data file and the deletion vector otherwise."""
    where = f"{dv.describe()}, for the data file {data_file}"
    if dv.storage == ICEBERG:
        return positions(dv, filesystem, where, rows)
    try:
        data = _bytes(dv, filesystem)
        deleted = decode(data)
    except FileNotFoundError:
        raise DataError(f"{where}: the deletion vector's file is gone (vacuumed or moved); the "
                        "table is damaged, or changed while it was read: read it again, or "
                        "train on a fixed version") from None
    except (ValueError, struct.error, OSError) as exc:
        raise DataError(f"{where} cannot be read: {exc}; the table is damaged (read it through "
                        "Spark with Delta Lake to check it)") from None
    if len(deleted) != dv.cardinality:
        raise DataError(f"{where} deletes {len(deleted)} rows where the log says "
                        f"{dv.cardinality}; the table is damaged")
    if len(deleted) and int(deleted[-1]) >= rows:
        raise DataError(f"{where} deletes row {int(deleted[-1])}, beyond the file's {rows} "
                        "rows; the deletion vector is not this file's (the table is damaged)")
    return deleted


def positions(dv: DeletionVector, filesystem: Any, where: str, rows: int) -> np.ndarray:
    """The sorted unique positions the Iceberg positional delete file ``dv.file`` deletes
    from the data file it names ``dv.where`` (its other data files' rows skipped: by their
    row groups' statistics where the file has them), each checked to be below ``rows``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

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
                        and not stats.min <= dv.where <= stats.max:
                    continue  # the delete file is sorted by file_path: another file's rows
                part = parquet.read_row_group(index, columns=["file_path", "pos"])
                if part["file_path"].null_count or part["pos"].null_count:
                    raise ValueError("it has null file_path or pos values, which the Iceberg "
                                     "spec requires")
                found.append(part["pos"].filter(pc.equal(part["file_path"], dv.where))
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


def _bytes(dv: DeletionVector, filesystem: Any) -> bytes:
    if dv.storage == "i":
        return z85_decode(dv.where, dv.size)
    with filesystem.open_input_file(dv.file) as f:
        if dv.offset == 0 or f.read_at(1, 0) != b"\x01":
            if dv.offset == 0:
                raise ValueError("its offset is 0, the file's version byte")
            raise ValueError(f"the file's version byte is {f.read_at(1, 0)!r}, not 1")
        head = f.read_at(4, dv.offset)
        if len(head) < 4:
            raise ValueError(f"offset {dv.offset} is past the end of the file")
        (size,) = struct.unpack(">i", head)
        if size != dv.size:
            raise ValueError(f"the file gives the bitmap {size} bytes, the log {dv.size}")
        body = f.read_at(size + 4, dv.offset + 4)
    if len(body) < size + 4:
        raise ValueError("the file ends inside the bitmap")
    data, (crc,) = body[:size], struct.unpack(">I", body[size:])
    if zlib.crc32(data) != crc:
        raise ValueError(f"its CRC-32 is {zlib.crc32(data):#010x}, the file says {crc:#010x}")
    return data


def decode(data: bytes) -> np.ndarray:
    """The sorted uint64 indexes of a serialized RoaringBitmapArray."""
    if len(data) < 12:
        raise ValueError(f"{len(data)} bytes is too short for a bitmap")
    (magic,) = struct.unpack_from("<i", data, 0)
    if magic == MAGIC_NATIVE:
        raise ValueError("the bitmap is in the native serialization, which Delta does not "
                         "write to tables")
    if magic != MAGIC_PORTABLE:
        raise ValueError(f"magic number {magic}, not {MAGIC_PORTABLE}")
    (count,) = struct.unpack_from("<q", data, 4)
    pos, parts, last = 12, [], -1
    for _ in range(count):
        (key,) = struct.unpack_from("<I", data, pos)
        if key <= last:
            raise ValueError("its bitmaps' keys are not in increasing order")
        low, pos = roaring32(data, pos + 4)
        parts.append((np.uint64(key) << np.uint64(32)) | low.astype(np.uint64))
        last = key
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} bytes follow the last bitmap")
    return np.concatenate(parts) if parts else np.zeros(0, np.uint64)


def roaring32(data: bytes, pos: int) -> tuple[np.ndarray, int]:
    """A 32-bit Roaring bitmap in the portable serialization at ``pos`` of ``data``: its
    values (sorted uint32) and the position after it."""
    (cookie,) = struct.unpack_from("<I", data, pos)
    pos += 4
    if cookie & 0xFFFF == _COOKIE:
        containers = (cookie >> 16) + 1
        run_flags = np.unpackbits(np.frombuffer(data, np.uint8, (containers + 7) // 8, pos),
                                  bitorder="little")[:containers].astype(bool)
        pos += (containers + 7) // 8
        has_offsets = containers >= _NO_OFFSET_THRESHOLD
    elif cookie == _COOKIE_NO_RUNS:
        (containers,) = struct.unpack_from("<I", data, pos)
        pos += 4
        run_flags = np.zeros(containers, bool)
        has_offsets = True
    else:
        raise ValueError(f"not a portable Roaring bitmap (cookie {cookie})")
    header = np.frombuffer(data, "<u2", 2 * containers, pos).reshape(containers, 2)
    pos += 4 * containers
    if has_offsets:
        pos += 4 * containers  # each container's offset: they follow one another anyway
    out = []
    for (key, card_minus_1), runs in zip(header.tolist(), run_flags.tolist()):
        high = np.uint32(key) << np.uint32(16)
        if runs:
            (n,) = struct.unpack_from("<H", data, pos)
            pairs = np.frombuffer(data, "<u2", 2 * n, pos + 2).reshape(n, 2).astype(np.uint32)
            pos += 2 + 4 * n
            lows = np.concatenate([np.arange(s, s + length + 1, dtype=np.uint32)
                                   for s, length in pairs.tolist()]) if n else \
                np.zeros(0, np.uint32)
        elif card_minus_1 + 1 <= 4096:
            lows = np.frombuffer(data, "<u2", card_minus_1 + 1, pos).astype(np.uint32)
            pos += 2 * (card_minus_1 + 1)
        else:
            words = np.frombuffer(data, "<u8", 1024, pos)
            pos += 8192
            lows = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")
                                  ).astype(np.uint32)
        if len(lows) != card_minus_1 + 1:
            raise ValueError(f"a container holds {len(lows)} values where its header says "
                             f"{card_minus_1 + 1}")
        out.append(high | lows)
    values = np.concatenate(out) if out else np.zeros(0, np.uint32)
    if len(values) > 1 and not (np.diff(values.astype(np.int64)) > 0).all():
        raise ValueError("its values are not in increasing order")
    return values, pos


class Deletes:
    """The deletion vectors of a table's files, by data file (one, or a tuple of them: the
    Iceberg delete files that apply to it); decoded on first use, a few kept per process
    (the files a rank reads, read again every epoch)."""

    def __init__(self, vectors: dict[str, DeletionVector | tuple[DeletionVector, ...]]):
        self.vectors = vectors
        self._decoded: OrderedDict[tuple[str, Any], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # the reader's threads share it

    def __bool__(self) -> bool:
        return bool(self.vectors)

    def deleted(self, filesystem: Any, path: str, rows: int) -> np.ndarray | None:
        """The sorted row indexes deleted from the data file ``path`` (``rows`` rows), or
        None where it has no deletion vector."""
        dv = self.vectors.get(path)
        if dv is None:
            return None
        key = (path, dv)
        with self._lock:
            found = self._decoded.get(key)
            if found is not None:
                self._decoded.move_to_end(key)
                return found
        # outside the lock: reads, maybe remote
        if isinstance(dv, DeletionVector):
            found = load(dv, filesystem, path, rows)
        else:
            parts = [load(d, filesystem, path, rows) for d in dv]
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
        return {"vectors": self.vectors}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["vectors"])  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Deletes) and other.vectors == self.vectors

    def __hash__(self) -> int:
        return hash(tuple(sorted((p, *keys(v)) for p, v in self.vectors.items())))


def keys(vectors: DeletionVector | tuple[DeletionVector, ...]) -> list[str]:
    """The keys of one data file's descriptor or descriptors."""
    return [vectors.key] if isinstance(vectors, DeletionVector) else [v.key for v in vectors]


def identity(listing: Any) -> list[list[str]]:
    """What a table's deletion vectors are (file, descriptor), for its fingerprint: a DELETE
    that rewrites none of the data files changes them alone."""
    if listing is None or not listing.deletes:
        return []
    return sorted([p, *keys(v)] for p, v in listing.deletes.vectors.items())
