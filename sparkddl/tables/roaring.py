"""Bitmaps of deleted rows as Delta Lake writes them, decoded to sorted row indexes.

A deletion vector's bitmap is a "RoaringBitmapArray": the magic number 1681511377 (4 bytes,
little-endian), the number of 32-bit bitmaps (8 bytes, little-endian), then for each its key,
the high 32 bits of the indexes it holds (4 bytes, little-endian), and a 32-bit Roaring bitmap
in the portable serialization every Roaring library writes. Inline bitmaps and the UUIDs of
deletion-vector files are Z85 text. Errors are ValueErrors saying what is wrong with the bytes;
:mod:`sparkddl.tables.masks` names the table's file around them.
"""
from __future__ import annotations

import struct

import numpy as np

MAGIC_PORTABLE = 1681511377  # RoaringBitmapArray, portable serialization (the protocol's)
MAGIC_NATIVE = 1681511376  # the same, native serialization: not written to tables
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
# Roaring's portable serialization
_COOKIE_NO_RUNS = 12346
_COOKIE = 12347
_NO_OFFSET_THRESHOLD = 4


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
