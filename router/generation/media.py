"""Images and audio as every dialect sends them, made one internal shape: a `Media` (the
bytes, the parameter that carried them, and whether they are an image or a sound) and a
MEDIA_MARKER where it stands in the text.

The router only takes the bytes out of their envelope (a `data:` URI, raw base64) and
bounds them; it never decodes them. The worker does (worker/media/pictures.py and
sounds.py), on a preparing thread, so that a crafted file costs a 400 and no time on the
event loop. A sound's format is told here by its first bytes only, as libmtmd's
is_audio_file tells it: to check what OpenAI's `format` says, and to tell which of
llama-server's multimodal_data are audio.

Remote URLs are not fetched unless the operator lists their hosts: a server that fetches URLs
its clients name is a tool for reaching what only it can reach (SSRF). An http(s) URL becomes
a Media with its `url`, which router/generation/image_urls.py fetches (or refuses) once the
job is built.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Iterator, Literal, Sequence, Union

import msgspec

from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import MEDIA_MARKER, Media, audio_format

# What a /completion prompt_string (llama-server's multimodal_data) marks each image with;
# the router writes MEDIA_MARKER in its place.
LLAMA_MEDIA_MARKER = "<__media__>"
MAX_IMAGE_BYTES = 20 * 1024 * 1024  # one image, or one sound, decoded (OpenAI's limit for an image)
MAX_IMAGES = 32  # images and sounds, in one request
# Base64 of MAX_IMAGE_BYTES, with room for line breaks: a longer string is refused unread.
_MAX_BASE64 = MAX_IMAGE_BYTES * 4 // 3 + 4096
# RFC 2397; its scheme and ";base64" in any case, as RFC 3986 and browsers read them.
_DATA_URI = re.compile(
    r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,", re.ASCII | re.IGNORECASE
)
_SPACE = re.compile(r"[ \t\r\n]+")  # line breaks and spaces a base64 text may hold; no others
# The image types the worker decodes; others are refused here, by their declared type.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif", "image/bmp")
AUDIO_FORMATS = ("wav", "mp3")  # OpenAI's input_audio.format


def from_base64(data: object, param: str, kind: Literal["image", "audio"] = "image") -> Media:
    """An image sent as base64 (Anthropic's `source.data`, Ollama's `images[i]`), or a sound
    (OpenAI's `input_audio.data`)."""
    what = "the image" if kind == "image" else "the audio"
    if not isinstance(data, str):
        raise InvalidRequest(f"Invalid type for '{param}': expected a base64 string.", param)
    if len(data) > _MAX_BASE64:
        raise InvalidRequest(f"Invalid value for '{param}': {what} is over {MAX_IMAGE_BYTES} bytes.", param)
    try:
        raw = base64.b64decode(_SPACE.sub("", data), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"Invalid value for '{param}': not valid base64 {kind} data.", param) from None
    if not raw:
        raise InvalidRequest(f"Invalid value for '{param}': {what} is empty.", param)
    if len(raw) > MAX_IMAGE_BYTES:
        raise InvalidRequest(f"Invalid value for '{param}': {what} is over {MAX_IMAGE_BYTES} bytes.", param)
    return Media(data=raw, param=param, kind=kind)


def from_input_audio(value: object, param: str) -> Media:
    """OpenAI's `input_audio` object: `{"data": "<base64>", "format": "wav" | "mp3"}`. A
    format that the data's first bytes contradict is a 400 naming it; data that is no audio
    at all is the worker's 400, naming the data."""
    if not isinstance(value, dict):
        raise InvalidRequest(f"Invalid type for '{param}': expected an object with 'data' and 'format'.", param)
    for key in ("data", "format"):
        if key not in value:
            raise InvalidRequest(f"Missing required parameter: '{param}.{key}'.", f"{param}.{key}")
    fmt = value["format"]
    if fmt not in AUDIO_FORMATS:
        raise InvalidRequest(
            f"Invalid value for '{param}.format': expected one of {list(AUDIO_FORMATS)}.", f"{param}.format"
        )
    m = from_base64(value["data"], f"{param}.data", "audio")
    found = audio_format(m.data)
    if found is not None and found != fmt:
        raise InvalidRequest(
            f"Invalid value for '{param}.format': the data is {found.upper()}, not {str(fmt).upper()}.", f"{param}.format"
        )
    return m


def from_url(url: object, param: str) -> Media:
    """An image sent as OpenAI's `image_url.url`: a `data:` URI, or bare base64 (which
    llama-server and several clients accept too). An http(s) URL is refused."""
    if not isinstance(url, str):
        raise InvalidRequest(f"Invalid type for '{param}': expected a string.", param)
    head = url[:16].lower()
    if head.startswith(("http://", "https://")):
        if len(url) > 8192:
            raise InvalidRequest(f"Invalid value for '{param}': the URL is over 8192 characters.", param)
        # Fetched, or refused, once the job is built (router/generation/image_urls.py).
        return Media(data=b"", param=param, url=url)
    if head.startswith("data:"):
        m = _DATA_URI.match(url[:256])
        if m is None or not m["b64"]:
            raise InvalidRequest(
                f"Invalid value for '{param}': expected a base64 data URI (data:image/png;base64,...).", param
            )
        mime = (m["mime"] or "").lower()
        if mime and mime not in IMAGE_TYPES:
            raise InvalidRequest(
                f"Invalid value for '{param}': unsupported image type {mime!r} (expected one of "
                f"{', '.join(t for t in IMAGE_TYPES if t != 'image/jpg')}).",
                param,
            )
        return from_base64(url[m.end():], param)
    if "://" in head:
        raise InvalidRequest(f"Invalid value for '{param}': expected a data URI with the image's bytes.", param)
    return from_base64(url, param)


def multimodal_prompt(p: dict[str, Any], param: str) -> tuple[str, list[Media]]:
    """llama-server's prompt object with images or audio: `prompt_string` with a "<__media__>"
    where each of `multimodal_data`'s base64 items goes, in order (server-common.cpp,
    tokenize_input_subprompt); the text comes back with MEDIA_MARKER in their places. An item
    is audio when its first bytes say WAV, MP3 or FLAC, as llama-server tells them
    (mtmd_helper_bitmap_init_from_buf), an image otherwise."""
    text = p.get("prompt_string")
    if not isinstance(text, str):
        raise InvalidRequest(
            f"Invalid type for '{param}.prompt_string': expected a string with the media markers.", f"{param}.prompt_string"
        )
    data = p.get("multimodal_data")
    if not isinstance(data, list):
        raise InvalidRequest(
            f"Invalid type for '{param}.multimodal_data': expected an array of base64 strings.", f"{param}.multimodal_data"
        )
    counted(len(data), f"{param}.multimodal_data")
    images = [from_base64(d, f"{param}.multimodal_data[{i}]") for i, d in enumerate(data)]
    images = [msgspec.structs.replace(m, kind="audio") if audio_format(m.data) else m for m in images]
    if text.count(LLAMA_MEDIA_MARKER) != len(images):
        raise InvalidRequest(
            f"Invalid value for '{param}.prompt_string': it holds {text.count(LLAMA_MEDIA_MARKER)} media markers "
            f"({LLAMA_MEDIA_MARKER}) for {len(images)} items of multimodal_data.",
            f"{param}.prompt_string",
        )
    if MEDIA_MARKER in text:  # the router's own: never a client's to place
        text = text.replace(MEDIA_MARKER, "")
    return text.replace(LLAMA_MEDIA_MARKER, MEDIA_MARKER), images


def counted(n: int, param: str) -> None:
    """A request's images and sounds so far, `n`, bounded; `param`: where the last came."""
    if n > MAX_IMAGES:
        raise InvalidRequest(f"Too many images and sounds: {n}; at most {MAX_IMAGES} in one request.", param)


Piece = Union[str, Media]


def pieces(content: str, media: Sequence[Media] | None) -> Iterator[Piece]:
    """A message's content split at its markers: text, image, text, ... (empty texts left
    out). For a dialect that sends images as parts of their own (an upstream's request)."""
    if not media:
        if content:
            yield content
        return
    texts = content.split(MEDIA_MARKER)
    for i, text in enumerate(texts):
        if text:
            yield text
        if i < len(media) and i < len(texts) - 1:
            yield media[i]


def mime_of(data: bytes) -> str:
    """An image's type from its first bytes, for a data URI sent on to an upstream."""
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"BM"):
        return "image/bmp"
    return "application/octet-stream"


def data_uri(m: Media) -> str:
    return f"data:{mime_of(m.data)};base64,{base64.b64encode(m.data).decode()}"


def openai_part(m: Media) -> dict[str, Any]:
    """An image or a sound as an OpenAI chat content part, for an upstream: an image_url with
    a data URI, or an input_audio (which takes WAV and MP3 only)."""
    if m.kind == "image":
        return {"type": "image_url", "image_url": {"url": data_uri(m)}}
    fmt = audio_format(m.data)
    if fmt not in AUDIO_FORMATS:
        raise Unsupported(
            f"The audio at '{m.param}' is {(fmt or 'not WAV or MP3').upper()}: an upstream's chat API takes WAV or MP3 only.",
            m.param,
        )
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(m.data).decode(), "format": fmt}}
