"""An image part's bytes into RGB pixels, bounded before any byte reaches C code.

The bytes are a client's: a crafted header can claim gigapixels (a decompression bomb), a
file can be truncated, animated, CMYK or 16 bits a channel. Pillow decodes them (maintained,
fuzzed by OSS-Fuzz, and already how Python reads images); llama.cpp's own loader (stb_image
inside libmtmd) never sees them. Only a width, a height and width x height x 3 bytes of RGB
go to libmtmd, and every refusal is a 400 naming the part.

Limits: `MAX_BYTES` of encoded image; `MAX_PIXELS` read from the header before any pixel is
decoded; JPEG, PNG, WebP, GIF and BMP only (fewer decoders, less attack surface); one frame;
8 bits a channel. An image whose longer side exceeds `MAX_SIDE` is scaled down (keeping its
shape) so that the projector's own resize works on a bounded array.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from worker.rejected import RequestRejected

MAX_BYTES = 20 * 1024 * 1024  # OpenAI's limit for one image
MAX_PIXELS = 40_000_000  # 8K by 5K; the header is read first, nothing larger is decoded
# All of one request's images together: decoding is the preparing thread's, which every
# request on the model passes (32 images of 40 M pixels took 43 s there, and held the
# others' prompts up as long).
REQUEST_PIXELS = 160_000_000
MAX_SIDE = 2048
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
# Pillow modes of 8 bits a channel that convert to RGB without guessing: grey, palette,
# alpha (dropped) and YCbCr (JPEG).
_EIGHT_BIT = {"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "RGBa", "YCbCr", "La"}


@dataclass(frozen=True)
class Pixels:
    width: int
    height: int
    rgb: bytes  # width * height * 3


def refuse(param: str, why: str) -> RequestRejected:
    return RequestRejected("invalid_request", f"Invalid image at '{param}': {why}", param)


@dataclass
class Budget:
    """The pixels a request's images may still decode (REQUEST_PIXELS in all)."""

    left: int = REQUEST_PIXELS


def decode(data: bytes, param: str, budget: Budget | None = None) -> Pixels:
    """The RGB pixels of `data`, upright as its EXIF orientation says (as a browser shows
    it), or a RequestRejected naming `param`."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if not data:
        raise refuse(param, "the image is empty.")
    if len(data) > MAX_BYTES:
        raise refuse(param, f"the image is {len(data)} bytes; at most {MAX_BYTES} are accepted.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=FORMATS)
            w, h = im.size
            if w < 1 or h < 1 or w * h > MAX_PIXELS:
                raise refuse(param, f"the image is {w}x{h} pixels; at most {MAX_PIXELS} pixels are accepted.")
            if budget is not None:
                if w * h > budget.left:
                    raise refuse(param, f"the request's images are over {REQUEST_PIXELS} pixels together.")
                budget.left -= w * h
            if getattr(im, "n_frames", 1) > 1:
                raise refuse(param, "animated images are not accepted; send one frame.")
            if im.mode not in _EIGHT_BIT:
                raise refuse(
                    param, f"images in mode {im.mode} (CMYK, 16-bit or float) are not accepted; send 8-bit RGB or greyscale."
                )
            if im.format == "JPEG":  # decoded at a fraction of its size where that still covers MAX_SIDE
                im.draft("RGB", (MAX_SIDE, MAX_SIDE))
            im.load()
            upright = ImageOps.exif_transpose(im) or im
            rgb = upright.convert("RGB")
            w, h = rgb.size
    except RequestRejected:
        raise
    except UnidentifiedImageError:
        raise refuse(param, f"not an image in a supported format ({', '.join(FORMATS)}).") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise refuse(param, f"the image claims more than {MAX_PIXELS} pixels.") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:  # truncated or malformed
        raise refuse(param, f"the image could not be decoded ({exc}).") from None
    if max(w, h) > MAX_SIDE:
        scale = MAX_SIDE / max(w, h)
        rgb = rgb.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BICUBIC)
    return Pixels(rgb.width, rgb.height, rgb.tobytes())
