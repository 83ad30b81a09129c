"""Embeddings from a model served elsewhere, in OpenAI's dialect: Ollama's /api/embed and
/api/embeddings reaching an upstream that speaks only OpenAI's API (POST /v1/embeddings).

The answer must be what was asked: one vector of numbers per input, in the inputs'
order (OpenAI's `index`), else the upstream's answer is refused as broken rather than
passed on with a vector missing or out of place.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import trio

from router.generation.remote.run import fetch
from router.server import access_log, json_text
from router.upstream.remote import RemoteModel
from supervisor.errors import WorkerCrashed

# The most of an answer read: Ollama's routes take at most 128 inputs, and 128 vectors of
# 4096 numbers are about 10 MB of JSON text, so this leaves room for anything a real
# upstream answers. Decoding it, and encoding Ollama's answer from it, hold the GIL and so
# every other request for about a second; an upstream's 200 MB answer held it for seven on
# the two-core machine (the outside probe of issue 40, N1).
MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Vectors:
    data: list[list[float]]
    prompt_tokens: int  # 0 where the upstream does not say


async def embed(remote: RemoteModel, texts: list[str]) -> Vectors:
    asked = {"model": remote.spec.model, "input": texts, "encoding_format": "float"}
    body, raw, more = await fetch(remote, "/v1/embeddings", asked, MAX_BYTES)
    if more:
        body.broken(f"an embeddings answer larger than {MAX_BYTES // (1024 * 1024)} MiB")
        raise WorkerCrashed(
            f"The upstream of model `{remote.name}` answered more than {MAX_BYTES // (1024 * 1024)} MiB of "
            f"embeddings for {len(texts)} input(s), more than any real answer holds."
        )
    try:
        # A large answer is read off the event loop: every other stream waits while it is.
        vectors = read(raw, len(texts)) if len(raw) < 1 << 20 else await trio.to_thread.run_sync(read, raw, len(texts))
    except ValueError as exc:
        body.broken(str(exc))
        raise WorkerCrashed(f"The upstream of model `{remote.name}` {exc}.") from None
    if (record := access_log.current()) is not None:
        record.prompt_tokens = vectors.prompt_tokens
    return vectors


class _Item(msgspec.Struct):
    embedding: list[float] | str  # a string: base64, which Corral did not ask for
    index: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None


class _Answer(msgspec.Struct):
    data: list[_Item]
    usage: _Usage | None = None


def read(raw: bytes, n: int) -> Vectors:
    """The vectors of an OpenAI embeddings answer for `n` inputs; ValueError saying what
    is wrong with it.

    Decoded straight into its types (json_text.decode_as): json.loads of a 170 MB answer
    held the event loop (and the GIL, from a thread too) for 7 s, this for under one, and no
    pass over 50 million numbers follows. Any other field of the answer is not read."""
    try:
        answer = json_text.decode_as(raw, _Answer)
    except msgspec.ValidationError as exc:
        if "embedding" in str(exc):
            raise ValueError(f"answered an embedding that is not a list of numbers ({exc})") from None
        raise ValueError(f"answered embeddings of another shape ({exc})") from None
    except ValueError:
        raise ValueError("answered embeddings that are not JSON") from None
    if len(answer.data) != n:
        raise ValueError(f"answered {len(answer.data)} embeddings for {n} inputs")
    out: list[list[float] | None] = [None] * n
    for i, item in enumerate(answer.data):
        at = item.index if item.index is not None else i
        if not 0 <= at < n or out[at] is not None:
            raise ValueError(f"answered an embedding with a wrong index ({at!r})")
        if isinstance(item.embedding, str):
            raise ValueError("answered an embedding that is not a list of numbers (base64?)")
        out[at] = item.embedding
    usage = answer.usage
    tokens = usage.prompt_tokens if usage is not None else None
    return Vectors([v for v in out if v is not None], tokens if tokens is not None and tokens >= 0 else 0)
