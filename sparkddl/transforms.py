"""Ready-made ``transformFn`` functions (a preset names them as ``sparkddl.transforms:name``).

Write your own as ``fn(batch) -> dict of tensors``; see :mod:`sparkddl.data.transform`.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def decode_images(batch: dict[str, Any]) -> dict[str, Any]:
    """Every column of encoded images (bytes: PNG, JPEG, anything Pillow reads) as float32
    ``[B, C, H, W]`` in [0, 1] (grayscale: C = 1; colour and palette: C = 3, alpha dropped;
    16-bit grey keeps its high byte). Other
    columns pass through. A batch of 8-bit PNGs of one size is decoded by
    ``decode_png_batch`` (zlib per image, the row filters undone with numpy across the
    whole batch); anything else by Pillow, one image at a time."""
    out = {}
    for name, values in batch.items():
        if not (isinstance(values, np.ndarray) and values.dtype == object and len(values)
                and isinstance(values[0], (bytes, bytearray))):
            continue
        stacked = decode_png_batch(values)
        if stacked is None:
            stacked = _decode_with_pillow(values)
        out[name] = stacked.astype(np.float32) / 255.0
    return out


def _decode_with_pillow(values: Any) -> np.ndarray:
    from io import BytesIO

    from PIL import Image
    images = []
    for data in values:
        with Image.open(BytesIO(data)) as image:
            if image.mode.startswith("I"):  # 16/32-bit grey: the high byte, not a clip
                wide = np.asarray(image).astype(np.int64)
                images.append(np.clip(wide >> 8, 0, 255).astype(np.uint8))
                continue
            if image.mode == "P":  # a palette may hold colours: as RGB
                image = image.convert("RGB")
            elif image.mode not in ("L", "RGB"):
                image = image.convert("RGB" if len(image.getbands()) >= 3 else "L")
            images.append(np.asarray(image, dtype=np.uint8))
    stacked = np.stack(images)
    return stacked[:, None] if stacked.ndim == 3 else stacked.transpose(0, 3, 1, 2)


_PNG = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # colour type -> bytes per pixel at 8 bits
_KEEP = {0: 1, 2: 3, 4: 1, 6: 3}  # channels kept: alpha dropped, as Pillow's convert does


def decode_png_batch(values: Any) -> np.ndarray | None:
    """8-bit, non-interlaced PNGs (grey, RGB, with or without alpha) that share one size and
    colour type, as uint8 ``[B, C, H, W]``; None when any image is not such a PNG (the
    caller falls back to Pillow). Only zlib and the chunk headers are per image."""
    import struct
    import zlib
    header = None
    streams = []
    for data in values:
        data = bytes(data)
        if not data.startswith(_PNG):
            return None
        pos, idat, ihdr = 8, [], None
        while pos + 8 <= len(data):
            length, kind = struct.unpack(">I4s", data[pos:pos + 8])
            body = data[pos + 8:pos + 8 + length]
            if kind in (b"IHDR", b"IDAT"):  # what is decoded must be what was written
                crc = data[pos + 8 + length:pos + 12 + length]
                if len(body) != length or len(crc) != 4 or \
                        struct.unpack(">I", crc)[0] != zlib.crc32(kind + body) & 0xFFFFFFFF:
                    return None
            if kind == b"IHDR":
                ihdr = body[:13]
            elif kind == b"IDAT":
                idat.append(body)
            elif kind == b"IEND":
                break
            pos += 12 + length
        if ihdr is None or (header is not None and ihdr != header):
            return None
        header = ihdr
        width, height, depth, colour, method, filtering, interlace = struct.unpack(
            ">IIBBBBB", ihdr)
        if depth != 8 or interlace or method or filtering or colour not in _CHANNELS:
            return None
        try:
            stream = zlib.decompress(b"".join(idat))
        except zlib.error:
            return None
        if len(stream) != height * (width * _CHANNELS[colour] + 1):
            return None  # each image whole: a short one must not shift the next
        streams.append(stream)
    assert header is not None
    width, height, _, colour, _, _, _ = struct.unpack(">IIBBBBB", header)
    bpp = _CHANNELS[colour]
    stride = width * bpp
    raw = np.frombuffer(b"".join(streams), dtype=np.uint8)
    if raw.size != len(values) * height * (stride + 1):
        return None
    raw = raw.reshape(len(values), height, stride + 1)
    if (raw[:, :, 0] > 4).any():  # not a PNG filter: Pillow refuses the file, so do we
        return None
    out = _unfilter(raw[:, :, 0], raw[:, :, 1:], bpp)
    out = out.reshape(len(values), height, width, bpp)[..., :_KEEP[colour]]
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2))


def _unfilter(kinds: np.ndarray, rows: np.ndarray, bpp: int) -> np.ndarray:
    """PNG's per-row filters undone, row by row for the whole batch at once (each image may
    use another filter on each row): None and Up at once, Sub as a cumulative sum, Average
    and Paeth pixel by pixel over the images that use them."""
    batch, height, stride = rows.shape
    width = stride // bpp
    out = np.zeros((batch, height, stride), dtype=np.uint8)
    up = np.zeros((batch, stride), dtype=np.int32)
    for r in range(height):
        cur = rows[:, r].astype(np.int32)
        kind = kinds[:, r]
        cur[kind == 2] += up[kind == 2]
        sub = np.flatnonzero(kind == 1)
        if len(sub):  # recon[i] = x[i] + recon[i - bpp]: a running sum per channel
            cur[sub] = np.cumsum(cur[sub].reshape(len(sub), width, bpp), axis=1).reshape(
                len(sub), stride)
        for code in (3, 4):
            idx = np.flatnonzero(kind == code)
            if not len(idx):
                continue
            x, above = cur[idx].reshape(len(idx), width, bpp), up[idx].reshape(
                len(idx), width, bpp)
            left = np.zeros((len(idx), bpp), dtype=np.int32)
            upleft = np.zeros((len(idx), bpp), dtype=np.int32)
            for i in range(width):
                b = above[:, i]
                if code == 3:
                    value = (x[:, i] + (left + b) // 2) % 256
                else:
                    p = left + b - upleft
                    pa, pb, pc = np.abs(p - left), np.abs(p - b), np.abs(p - upleft)
                    pred = np.where((pa <= pb) & (pa <= pc), left,
                                    np.where(pb <= pc, b, upleft))
                    value = (x[:, i] + pred) % 256
                x[:, i] = value
                left, upleft = value, b
            cur[idx] = x.reshape(len(idx), stride)
        up = cur % 256
        out[:, r] = up
    return out
