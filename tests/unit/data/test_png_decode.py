"""decode_png_batch against Pillow and against the pixels themselves, with every PNG row
filter forced by a small encoder written here (Pillow picks its filters itself)."""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest

from sparkddl.transforms import _decode_with_pillow, decode_images, decode_png_batch

PIL = pytest.importorskip("PIL.Image")


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + \
        struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def encode(pixels: np.ndarray, filters: list[int]) -> bytes:
    """An 8-bit PNG of ``pixels`` [H, W, C] with row r filtered by ``filters[r]``."""
    height, width, channels = pixels.shape
    colour = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    flat = pixels.reshape(height, width * channels).astype(int)
    raw = bytearray()
    for r in range(height):
        kind, row = filters[r], flat[r]
        up = flat[r - 1] if r else np.zeros_like(row)
        out = []
        for i, x in enumerate(row):
            left = row[i - channels] if i >= channels else 0
            upleft = up[i - channels] if i >= channels else 0
            pred = [0, left, up[i], (left + up[i]) // 2, _paeth(left, up[i], upleft)][kind]
            out.append((x - pred) % 256)
        raw += bytes([kind, *out])
    ihdr = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + \
        _chunk(b"IDAT", zlib.compress(bytes(raw))) + _chunk(b"IEND", b"")


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_every_filter_on_every_row_decodes_to_the_pixels(channels):
    rng = np.random.default_rng(channels)
    images, pngs = [], []
    for _k in range(40):
        pixels = rng.integers(0, 256, (7, 5, channels), dtype=np.uint8)
        filters = [int(f) for f in rng.integers(0, 5, 7)]  # each row its own, per image
        images.append(pixels)
        pngs.append(encode(pixels, filters))
    values = np.array(pngs, dtype=object)
    got = decode_png_batch(values)
    keep = {1: 1, 2: 1, 3: 3, 4: 3}[channels]  # alpha dropped, as Pillow's convert does
    want = np.stack(images)[..., :keep].transpose(0, 3, 1, 2)
    assert got is not None and np.array_equal(got, want)
    assert np.array_equal(_decode_with_pillow(values), want)  # the encoder is valid PNG


def test_what_the_batch_decoder_does_not_take_goes_to_pillow():
    rng = np.random.default_rng(0)

    def pil_png(a, mode, **kw):
        buf = io.BytesIO()
        PIL.fromarray(a, mode).save(buf, "PNG", **kw)
        return buf.getvalue()

    mixed = np.array([pil_png(rng.integers(0, 256, (8, 8), dtype=np.uint8), "L"),
                      pil_png(rng.integers(0, 256, (9, 8), dtype=np.uint8), "L")], dtype=object)
    assert decode_png_batch(mixed) is None  # two sizes
    jpeg = io.BytesIO()
    PIL.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "RGB").save(jpeg, "JPEG")
    assert decode_png_batch(np.array([jpeg.getvalue()], dtype=object)) is None
    out = decode_images({"img": np.array([jpeg.getvalue()] * 2, dtype=object),
                         "label": np.array([1, 2])})
    assert set(out) == {"img"} and out["img"].shape == (2, 3, 8, 8)
    assert out["img"].dtype == np.float32 and 0 <= out["img"].min() <= out["img"].max() <= 1


def test_damaged_or_unusual_pngs_fall_back_or_decode_right():
    rng = np.random.default_rng(1)
    pixels = [rng.integers(0, 256, (4, 4, 1), dtype=np.uint8) for _ in range(2)]
    good = [encode(p, [0, 1, 2, 4]) for p in pixels]
    # a filter byte that is no PNG filter (5): the batch decoder refuses, as Pillow does
    bad_filter = bytearray(good[0])
    body_at = bad_filter.index(b"IDAT") + 4
    length = struct.unpack(">I", bad_filter[body_at - 8:body_at - 4])[0]
    raw = bytearray(zlib.decompress(bytes(bad_filter[body_at:body_at + length])))
    raw[0] = 5
    patched = encode(pixels[0], [0, 1, 2, 4])[:body_at - 8] + _chunk(b"IDAT", zlib.compress(
        bytes(raw))) + _chunk(b"IEND", b"")
    assert decode_png_batch(np.array([patched, good[1]], dtype=object)) is None
    # one image a row short and the next a row long: refused, not shifted
    short = encode(pixels[0][:3], [0, 0, 0])
    assert decode_png_batch(np.array([short, good[1]], dtype=object)) is None
    # a corrupted IDAT (its CRC no longer matches): refused
    corrupt = bytearray(good[0])
    corrupt[body_at + 2] ^= 0xFF
    assert decode_png_batch(np.array([bytes(corrupt)], dtype=object)) is None
    # palette colours come out as RGB, 16-bit grey keeps its high byte
    colours = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PIL.fromarray(colours, "RGB").convert("P", palette=PIL.Palette.ADAPTIVE).save(buf, "PNG")
    out = _decode_with_pillow(np.array([buf.getvalue()], dtype=object))
    assert out.shape == (1, 3, 4, 4)
    grey16 = (rng.integers(0, 65536, (3, 3))).astype(np.uint16)
    buf = io.BytesIO()
    PIL.fromarray(grey16).save(buf, "PNG")  # mode I;16
    out = _decode_with_pillow(np.array([buf.getvalue()], dtype=object))
    assert np.array_equal(out[0, 0], (grey16 >> 8).astype(np.uint8))
