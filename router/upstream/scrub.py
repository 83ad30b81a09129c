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
server may front two models with two keys. The forms scrubbed are the key as sent, as
JSON encoders write it (PHP's `\\/`, Go's `\\u003c`), as HTML writes it (`&#115;`, `&#x73;`,
`&amp;`: an error page), as a URL quotes it and as base64 writes it (at any of the three
alignments); its first characters without its last few; and a masked key that shows more
than a mask should. A key masked as OpenAI masks it ("sk-proj-****abcd": at most 8
characters of its start and 4 of its end, at most half of it) is no longer the key and is
left alone: it tells an operator which key was refused.

A relayed body is scrubbed whole, a 200 stream of model output included. An error can
come as an event inside a 200 stream, and the relay passes bytes on without parsing them,
so it cannot tell output from error without a scan anyway; the scan is a substring search
per form (about 10 us for a server-sent event with three keys and an `&` in it, against about 0.5 ms of CPU
the relay spends per token). A model has no business writing the operator's key, and one
that echoes it has still put the operator's key in an answer. A body the upstream
compressed although asked not to (`accept-encoding: identity`) passes as it came: no scan
sees into it.

Pure apart from `scrubbed_errors`, which only re-raises: text in, text out.
"""

from __future__ import annotations

import base64
import bisect
import re
import urllib.parse
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import httpx

REDACTED = "[redacted]"
_REDACTED = REDACTED.encode()

# A run of a key's first characters this long is taken out as the key is: "Bearer
# sk-...c1" with only its last character cut is one guess from the key. A masked key
# (OpenAI writes "sk-proj-...abcd") shows far fewer.
_PREFIX_KEPT = 8  # a key's last characters a quoted prefix may lack and still be taken out
_PREFIX_MIN = 12  # but never a run shorter than this (or than the key): "sk-proj-" is no secret

# Escapes of one character: JSON's \uXXXX (any encoder may write any character so, .NET
# writes `+` as \u002B, some servers every character) and \/ \" \\; HTML's numeric
# references (&#115; &#x73;) and the five named ones a page escapes a key's `&<>"'` with.
_ESCAPE = re.compile(
    rb'\\(?:u([0-9a-fA-F]{4})|(["\\/]))|&#(?:([0-9]{1,7})|[xX]([0-9a-fA-F]{1,6}));|&(amp|lt|gt|quot|apos|#39);'
)
_NAMED = {b"amp": b"&", b"lt": b"<", b"gt": b">", b"quot": b'"', b"apos": b"'", b"#39": b"'"}
# An escape cut by a chunk's end, which the next chunk may complete.
_OPEN_ESCAPE = re.compile(rb'(?:\\(?:u[0-9a-fA-F]{0,3})?|&(?:#[xX]?[0-9a-fA-F]{0,7}|[a-z]{0,4}))$')
# What masks a key's middle: asterisks, bullets, an ellipsis, two dots or more.
_MASK = re.compile(rb"(?:\*|\xe2\x80\xa2)+|\xe2\x80\xa6|\.{2,}")
_MASK_HEAD = 8  # a mask may show this much of a key's start
_MASK_TAIL = 4  # and this much of its end


def _threshold(key: bytes) -> int:
    return min(len(key), max(_PREFIX_MIN, len(key) - _PREFIX_KEPT))


class _View:
    """`raw` with JSON's escapes decoded, and where each decoded byte came from, so that a
    key written with any mix of escapes is found in the decoded text and taken out of the
    raw one. Escapes are few: the map holds one entry per escape, not per byte."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        parts: list[bytes] = []
        self._starts: list[int] = []  # view offset where each segment starts
        self._raw_at: list[int] = []  # its raw offset
        self._escape_len: list[int] = []  # 0: a plain run; else the escape's raw length
        at = view = 0
        for m in _ESCAPE.finditer(raw):
            if m.start() > at:
                self._segment(view, at, 0)
                parts.append(raw[at : m.start()])
                view += m.start() - at
            code = m.group(1) or m.group(4)
            if code is not None or m.group(3) is not None:
                number = int(code, 16) if code is not None else int(m.group(3))
                char = chr(min(number, 0x10FFFF)).encode("utf-8", "surrogatepass")
            elif m.group(5) is not None:
                char = _NAMED[m.group(5)]
            else:
                char = m.group(2)
            self._segment(view, m.start(), m.end() - m.start())
            parts.append(char[:1] if len(char) == 1 else b"\x00")  # a key is ASCII: others never match
            view += 1
            at = m.end()
        if at < len(raw):
            self._segment(view, at, 0)
            parts.append(raw[at:])
        self.text = b"".join(parts)

    def _segment(self, view: int, raw: int, escape: int) -> None:
        self._starts.append(view)
        self._raw_at.append(raw)
        self._escape_len.append(escape)

    def raw_start(self, i: int) -> int:
        """The raw offset of view byte `i`."""
        k = bisect.bisect_right(self._starts, i) - 1
        return self._raw_at[k] + (0 if self._escape_len[k] else i - self._starts[k])

    def raw_end(self, i: int) -> int:
        """The raw offset just past view byte `i`."""
        k = bisect.bisect_right(self._starts, i) - 1
        esc = self._escape_len[k]
        return self._raw_at[k] + esc if esc else self._raw_at[k] + i - self._starts[k] + 1


class Scrubber:
    """Takes every key in `keys` out of upstream text, replaced by REDACTED: written as it
    is, with any of JSON's or HTML's escapes for any of its characters, percent-quoted, in
    base64, its first characters quoted without its last few, or masked showing too much."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = sorted({k.encode() for k in keys if k}, key=len, reverse=True)
        literal = {urllib.parse.quote(k.decode(), safe="").encode() for k in self._keys}
        literal |= {b for k in self._keys for b in _base64_forms(k)}
        self._quoted = sorted(literal - set(self._keys), key=len, reverse=True)
        self.longest = max((len(k) for k in self._keys), default=0) * 10  # every character &#1234567;
        # The bytes a key's form (or an escape in one) may end a chunk with.
        self._alphabet = frozenset(b"".join(self._keys + self._quoted) + b"\\u0123456789abcdefABCDEF%&#;xXmpltgquos")

    def __bool__(self) -> bool:
        return bool(self._keys)

    def text(self, text: str) -> str:
        if not self._keys:
            return text
        # Keys are ASCII, so a span taken out never cuts a character in two.
        return self.data(text.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass")

    def data(self, data: bytes) -> bytes:
        if not self._keys:
            return data
        spans = self._spans(data)
        if not spans:
            return data
        out, at = [], 0
        for start, end in spans:
            if start >= at:
                out += [data[at:start], _REDACTED]
                at = end
            elif end > at:
                at = end
        out.append(data[at:])
        return b"".join(out)

    def _spans(self, data: bytes) -> list[tuple[int, int]]:
        spans: list[tuple[int, int]] = []
        view = _View(data) if b"\\" in data or b"&" in data else None
        text = view.text if view is not None else data

        def span(i: int, end: int) -> None:
            """View bytes i..end-1 taken out, as the raw bytes they came from."""
            spans.append((i, end) if view is None else (view.raw_start(i), view.raw_end(end - 1)))

        for key in self._keys:
            least = _threshold(key)
            head = key[:least]
            i = text.find(head)
            while i != -1:
                n = least
                while n < len(key) and i + n < len(text) and text[i + n] == key[n]:
                    n += 1
                span(i, i + n)
                i = text.find(head, i + n)
            for i, end in _masked(text, key):
                span(i, end)
        for quoted in self._quoted:
            i = data.find(quoted)
            while i != -1:
                spans.append((i, i + len(quoted)))
                i = data.find(quoted, i + len(quoted))
        spans.sort()
        return spans

    def held(self, data: bytes) -> int:
        """How many bytes at the end of `data` could begin a key (in any of its forms), or
        an escape, that the next chunk may complete."""
        if not self._keys or not data or data[-1] not in self._alphabet:
            return 0  # an event's closing newline is in no key: nothing held, at once
        tail_at = max(0, len(data) - self.longest)
        tail = data[tail_at:]
        held = 0
        if (m := _OPEN_ESCAPE.search(tail)) is not None:
            held = len(tail) - m.start()
        view = _View(tail[: len(tail) - held])
        text, widest = view.text, len(self._keys[0])
        for i in range(max(0, len(text) - widest), len(text)):
            rest = text[i:]
            if any(k.startswith(rest) for k in self._keys):
                return max(held, len(tail) - view.raw_start(i))
        for quoted in self._quoted:
            for n in range(min(len(quoted), len(data)), 0, -1):
                if data.endswith(quoted[:n]):
                    held = max(held, n)
                    break
        return held

    def stream(self) -> StreamScrub:
        return StreamScrub(self)


def _base64_forms(key: bytes) -> list[bytes]:
    """What base64 (standard and URL-safe) writes for `key` wherever it starts in the
    encoded bytes: per alignment, the groups of four that hold only the key's bytes."""
    forms = []
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + key + b"\0\0")
        first = 4 if offset else 0  # a group shared with what came before
        whole = (offset + len(key)) // 3  # groups made of the key's bytes (and before) only
        core = encoded[first : whole * 4]
        if len(core) >= 12:
            forms += [core, core.replace(b"+", b"-").replace(b"/", b"_")]
    return forms


def _masked(text: bytes, key: bytes) -> Iterator[tuple[int, int]]:
    """Where `text` holds `key` masked so as to show more of it than a mask should: its
    start, a mask (_MASK), then its end, with more than _MASK_HEAD of its start, more than
    _MASK_TAIL of its end, or more than half of it in all shown."""
    head = key[: min(4, len(key))]
    i = text.find(head)
    while i != -1:
        p = len(head)
        while p < len(key) and i + p < len(text) and text[i + p] == key[p]:
            p += 1
        mask = _MASK.match(text, i + p)
        if mask is not None and p < len(key):
            after = mask.end()
            tail = next(
                (t for t in range(min(len(key) - p, len(text) - after), 0, -1) if text[after : after + t] == key[-t:]), 0
            )
            if p > _MASK_HEAD or tail > _MASK_TAIL or p + tail > len(key) // 2:
                yield i, after + tail
        i = text.find(head, i + 1)


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
        # What may begin a key is held back before anything is taken out: a long run of a
        # key's start at the end must wait for the rest of the key, to go with it.
        data = self._held + chunk
        n = self.scrubber.held(data)
        ready, self._held = (data[:-n], data[-n:]) if n else (data, b"")
        return self.scrubber.data(ready)

    def end(self) -> bytes:
        """What was held back, at the body's end, scrubbed: a long run of a key's start."""
        rest, self._held = self._held, b""
        return self.scrubber.data(rest)


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
