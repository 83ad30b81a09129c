"""worker/media/pictures.py: a client's image bytes into RGB pixels, or a 400 naming the part
(issue 42, item 5). Every refusal happens in Python, before a byte reaches libmtmd."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from worker.media import pictures
from worker.media.pictures import MAX_PIXELS, MAX_SIDE, decode
from worker.rejected import RequestRejected


def encoded(im: Image.Image, fmt: str = "PNG", **kw: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def png_header_claiming(w: int, h: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def refused(data: bytes) -> str:
    with pytest.raises(RequestRejected) as info:
        decode(data, "messages[0].content[1]")
    assert info.value.param == "messages[0].content[1]" and info.value.code == "invalid_request"
    assert "messages[0].content[1]" in info.value.message
    return info.value.message


RGB = Image.fromarray(np.arange(12 * 10 * 3, dtype=np.uint8).reshape(10, 12, 3))


@pytest.mark.parametrize(
    ("mode", "fmt"), [("RGB", "PNG"), ("RGBA", "PNG"), ("L", "PNG"), ("P", "PNG"), ("LA", "PNG"), ("RGB", "JPEG"),
                      ("RGB", "WEBP"), ("RGB", "BMP"), ("P", "GIF"), ("1", "PNG")],
)
def test_every_accepted_kind_becomes_rgb_of_its_size(mode: str, fmt: str) -> None:
    p = decode(encoded(RGB.convert(mode), fmt), "x")
    assert (p.width, p.height) == (12, 10) and len(p.rgb) == 12 * 10 * 3


def test_lossless_pixels_arrive_as_sent() -> None:
    assert decode(encoded(RGB), "x").rgb == RGB.tobytes()


def test_a_large_image_is_scaled_to_the_bound_keeping_its_shape() -> None:
    p = decode(encoded(Image.new("RGB", (MAX_SIDE * 2, MAX_SIDE // 2), "red")), "x")
    assert (p.width, p.height) == (MAX_SIDE, MAX_SIDE // 4)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "empty"),
        (b"hello, not an image", "not an image"),
        (encoded(RGB)[:60], "could not be decoded"),
        (png_header_claiming(100_000, 100_000), "pixels"),
        (png_header_claiming(MAX_PIXELS // 1000 + 1, 1000), "pixels"),
        (encoded(Image.new("RGB", (4, 4)), "TIFF"), "not an image"),
        (encoded(RGB.convert("CMYK"), "JPEG"), "CMYK"),
        (encoded(Image.fromarray(np.full((4, 4), 40000, np.uint16))), "16-bit"),
        (encoded(Image.fromarray(np.zeros((4, 4), np.float32)), "TIFF"), "not an image"),
        (encoded(Image.new("RGB", (4, 4)), "GIF", save_all=True, append_images=[Image.new("RGB", (4, 4), "red")]),
         "animated"),
    ],
    ids=["empty", "text", "truncated", "bomb", "over-pixels", "tiff", "cmyk", "16-bit", "float", "animated"],
)
def test_each_bad_image_is_refused_naming_its_part(data: bytes, says: str) -> None:
    assert says in refused(data)


def test_more_bytes_than_the_bound_are_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pictures, "MAX_BYTES", 20)
    assert "bytes" in refused(encoded(RGB))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2048), cut=st.integers(0, 400))
def test_no_bytes_raise_anything_but_a_refusal(data: bytes, cut: int) -> None:
    """Random bytes, and real images cut or with bytes changed: pixels or a 400, never an
    exception of another kind (which would be a 500)."""
    for sample in (data, encoded(RGB)[:cut] + data, encoded(RGB, "JPEG")[:cut] + data):
        try:
            p = decode(sample, "x")
        except RequestRejected:
            continue
        assert len(p.rgb) == p.width * p.height * 3


def test_an_exif_rotated_photo_comes_upright() -> None:
    tall = Image.new("RGB", (20, 10), "red")
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90° clockwise to view
    p = decode(encoded(tall, "JPEG", exif=exif), "x")
    assert (p.width, p.height) == (10, 20)


def test_a_requests_images_share_one_pixel_budget() -> None:
    budget = pictures.Budget(left=300)
    decode(encoded(RGB), "a", budget)  # 120 pixels
    decode(encoded(RGB), "b", budget)
    with pytest.raises(RequestRejected) as info:
        decode(encoded(RGB), "c", budget)
    assert info.value.param == "c" and "together" in info.value.message
