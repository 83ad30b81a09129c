"""The keys Corral sends to other servers never come back out of it (issue 40, finding 6).

Some upstreams quote the key they refused ("Incorrect API key provided: Bearer sk-..."),
in a 401's body, in an error event of a stream, or in a header. Everything an upstream
says enters Corral at three places, and each passes through a `Scrubber` there, so that
nothing downstream (the client's answer, relayed or translated; an error's message; the
log; a replica's `last_error` in /admin/models and /v1/models) has to remember to:

- a response's header values (router/upstream/relay.py, once per answer);
- a response's body, chunk by chunk (`StreamScrub`, router/upstream/relay.py's
  RelayedBody): a key split across two chunks is held back until the next one says
  whether it completes the key;
- the text of httpx's transport errors (`scrubbed_errors`): h11 quotes the bytes it could
  not parse, which may be a header line that echoes the key.

Every key is scrubbed from every upstream's text, not only the key sent there: the same
server may front two models with two keys. The forms scrubbed are the key as sent and as
JSON encoders write it (PHP's `\\/`, Go's `\\u003c`) or a URL quotes it; a key masked by the
upstream ("sk-...abcd", as OpenAI writes it) is no longer the key and is left alone.

A relayed body is scrubbed whole, a 200 stream of model output included. An error can
come as an event inside a 200 stream, and the relay passes bytes on without parsing them,
so it cannot tell output from error without a scan anyway; the scan is a substring search
per form (about 3 us for a server-sent event with three keys, against about 0.5 ms of CPU
the relay spends per token). A model has no business writing the operator's key, and one
that echoes it has still put the operator's key in an answer. A body the upstream
compressed although asked not to (`accept-encoding: identity`) passes as it came: no scan
sees into it.

Pure apart from `scrubbed_errors`, which only re-raises: text in, text out.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import httpx

REDACTED = "[redacted]"


def forms(key: str) -> set[str]:
    """The ways `key` is written in an upstream's answer by the encoders in common use.
    Keys are visible ASCII (supervisor/config/upstreams.py), so JSON escapes only `"`
    and backslash, and optionally `/` and `<>&`."""
    escaped = json.dumps(key)[1:-1]  # `"` and `\`
    go = escaped.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return {key, escaped, escaped.replace("/", "\\/"), go, urllib.parse.quote(key, safe="")}


class Scrubber:
    """Replaces every form of every key in `keys` with REDACTED. Longer forms go first,
    so that a key that holds another is replaced whole."""

    def __init__(self, keys: Iterable[str]) -> None:
        every = {f for key in keys if key for f in forms(key)}
        self._texts = sorted(every, key=len, reverse=True)
        self._bytes = [f.encode() for f in self._texts]
        self._redacted = REDACTED.encode()
        # The bytes any form holds, and those one starts with: a chunk whose last byte is
        # in no key (an event's closing newline) holds nothing back, found in one lookup.
        self._alphabet = frozenset(b"".join(self._bytes))
        self._firsts = frozenset(f[0] for f in self._bytes)

    def __bool__(self) -> bool:
        return bool(self._texts)

    def text(self, text: str) -> str:
        for f in self._texts:
            if f in text:
                text = text.replace(f, REDACTED)
        return text

    def data(self, data: bytes) -> bytes:
        for f in self._bytes:
            if f in data:
                data = data.replace(f, self._redacted)
        return data

    def held(self, data: bytes) -> int:
        """How many bytes at the end of `data` could be the start of a key's form, which
        the next chunk may complete."""
        if not data or data[-1] not in self._alphabet:
            return 0
        start, held = max(0, len(data) - self.longest + 1), 0
        for first in self._firsts:  # the earliest match is the longest tail
            i = data.find(first, start)
            while i != -1 and len(data) - i > held:
                if any(f.startswith(data[i:]) for f in self._bytes):
                    held = len(data) - i
                    break
                i = data.find(first, i + 1)
        return held

    @property
    def longest(self) -> int:
        return len(self._bytes[0]) if self._bytes else 0

    def stream(self) -> StreamScrub:
        return StreamScrub(self)


class StreamScrub:
    """One body's bytes, scrubbed as they arrive. `feed` gives what may go out now: a
    chunk's end that could begin a key is held back until the next chunk. Server-sent
    events and NDJSON chunks end in a newline, which no key holds, so in practice a stream
    holds nothing back and its tokens are not delayed."""

    def __init__(self, scrubber: Scrubber) -> None:
        self.scrubber = scrubber
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self.scrubber:
            return chunk
        data = self.scrubber.data(self._held + chunk)
        n = self.scrubber.held(data)
        out, self._held = (data[:-n], data[-n:]) if n else (data, b"")
        return out

    def end(self) -> bytes:
        """What was held back, at the body's end: only the start of a key, never a whole one."""
        rest, self._held = self._held, b""
        return rest


@contextmanager
def scrubbed_errors(scrubber: Scrubber) -> Iterator[None]:
    """httpx's transport errors raised inside, with the keys taken out of their text: the
    same exception class (what callers catch and count), from nothing (the original, key
    and all, stays out of every traceback)."""
    try:
        yield
    except httpx.TransportError as exc:
        text = str(exc)
        clean = scrubber.text(text)
        if clean == text:
            raise
        try:
            request: httpx.Request | None = exc.request
        except RuntimeError:  # raised without one
            request = None
        raise type(exc)(clean, request=request) from None
