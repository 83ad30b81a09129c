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
server may front two models with two keys. A key is found however a reader of the text
would read it: through any mix and layering of JSON's, HTML's and URL escapes
(router/upstream/scrub_view.py), and in base64, of any of those, read as base64 decodes. What is
taken out is every run of a key's characters that shows more of it than a mask does: 9
of its start, 5 of its end, or 12 from anywhere. A key masked as OpenAI masks it
("sk-proj-****abcd": 8 of its start, 4 of its end) is left alone, to tell an operator which
key was refused. A chunk that ends in what the next one may make more of a key (an escape
cut short, a run of a key's characters, the start of a base64 form) is held back until
that next one comes.

A relayed body is scrubbed whole, a 200 stream of model output included. An error can
come as an event inside a 200 stream, and the relay passes bytes on without parsing them,
so it cannot tell output from error without a scan anyway; the scan is a substring search
per form (about 10 to 20 us for a server-sent event with three keys, against about 0.5 ms of CPU
the relay spends per token). A model has no business writing the operator's key, and one
that echoes it has still put the operator's key in an answer. A body the upstream
compressed although asked not to (`accept-encoding: identity`) is decoded before the scan
(gzip, deflate); one in a coding Corral cannot read is not passed on (router/upstream/relay.py).

Pure apart from `scrubbed_errors`, which only re-raises: text in, text out.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import httpx

from router.upstream.scrub_view import ESCAPE_BYTES, View

REDACTED = "[redacted]"
_REDACTED = REDACTED.encode()

# What of a key may show, as OpenAI's masks show it ("sk-proj-****abcd"): runs of a key's
# characters longer than these are taken out, wherever they stand and whatever surrounds
# them (a mask of asterisks, dots, X's, or nothing).
_HEAD = 9  # a run of its first characters this long: "sk-proj-" is no secret, one more is
_TAIL = 5  # a run of its last characters this long: the last 4 tell which key was refused
_RUN = 12  # a run of any of its characters this long
_TILE = _RUN // 2  # any run of _RUN - 1 or more holds a whole tile of this length
# Base64 long enough to hold _TAIL bytes, and a chunk's end that may begin or go on with one.
_BASE64_RUN = re.compile(rb"[A-Za-z0-9+/_-]{8,}=*")
_BASE64_TAIL = re.compile(rb"[A-Za-z0-9+/_-]+=*$")
_BASE64_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-="
MAX_HELD = 64 * 1024  # what a stream may hold back at most, waiting for the next chunk


class Scrubber:
    """Takes every key in `keys` out of upstream text, replaced by REDACTED: written as it
    is or with any mix of JSON's, HTML's and URL escapes (router/upstream/scrub_view.py), in
    base64 (of any of those), or in part: _HEAD of its start, _TAIL of its end, _RUN of
    anywhere in it."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = sorted({k.encode() for k in keys if k}, key=len, reverse=True)
        self._needles = [(key, _needles(key)) for key in self._keys]
        # Any needle of any key: most text holds none, and one search says so.
        self._any = re.compile(b"|".join(re.escape(n) for _, ns in self._needles for n, _ in ns) or b"(?!)")
        # The bytes a key's form (or an escape in one) may end a chunk with.
        self._alphabet = frozenset(b"".join(self._keys) + ESCAPE_BYTES + _BASE64_BYTES)

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
        view = View(data)
        spans = [view.raw_span(i, end) for i, end in self._runs(view.text)]
        # A run of base64 is read as its reader would decode it: any of the above in it
        # (a key, a part of one, a key URL-quoted first) takes the whole run out.
        for m in _BASE64_RUN.finditer(view.text):
            if any(True for _ in self._runs(View(_unbase64(m.group())).text)):
                spans.append(view.raw_span(m.start(), m.end()))
        spans.sort()
        return spans

    def _runs(self, text: bytes) -> Iterator[tuple[int, int]]:
        if self._any.search(text) is None:
            return
        for key, needles in self._needles:
            yield from _runs(text, key, needles)

    def held(self, data: bytes) -> int:
        """How many bytes at the end of `data` the next chunk may make part of a key's form:
        an escape cut short in any layer, a run of a key's characters (a run that ends here
        may go on there, past what may show), or a run of base64 (which the next chunk's
        bytes decode with). At most MAX_HELD: more is no form a server writes."""
        if not self._keys or not data or data[-1] not in self._alphabet:
            return 0  # an event's closing newline is in no key: nothing held, at once
        # An escape cut short, and what it would close: "%26%2" is "&" and an open "%2",
        # which may make "&#", another escape's start, so both wait.
        cut = len(data)
        while (opened := View(data[:cut]).open_escape()) is not None and opened < cut:
            cut = opened
        held = len(data) - cut
        view = View(data[:cut])
        text = view.text
        for i in range(max(0, len(text) - len(self._keys[0])), len(text)):
            if any(text[i:] in key for key in self._keys):
                held = max(held, len(data) - view.raw_span(i, i + 1)[0])
                break
        if (m := _BASE64_TAIL.search(text)) is not None:
            held = max(held, len(data) - view.raw_span(m.start(), m.start() + 1)[0])
        return min(held, MAX_HELD)

    def stream(self) -> StreamScrub:
        return StreamScrub(self)


def _needles(key: bytes) -> list[tuple[bytes, int]]:
    """What a run of `key` that shows too much holds at least one of, and where each stands
    in the key: its first _HEAD characters, its last _TAIL, or a whole tile of _TILE."""
    head, tail = min(_HEAD, len(key)), min(_TAIL, len(key))
    needles = {(key[:head], 0), (key[len(key) - tail :], len(key) - tail)}
    needles |= {(key[j : j + _TILE], j) for j in range(0, len(key) - _TILE + 1, _TILE)}
    return sorted(needles)


def _runs(text: bytes, key: bytes, needles: list[tuple[bytes, int]]) -> Iterator[tuple[int, int]]:
    """The runs of `key`'s characters in `text`, as they stand in the key, that show more of
    it than a mask may: _HEAD of its start, _TAIL of its end, or _RUN of anywhere."""
    head, tail, run = min(_HEAD, len(key)), min(_TAIL, len(key)), min(_RUN, len(key))
    for needle, at in needles:
        i = text.find(needle)
        while i != -1:
            # Grow the run both ways while text and key agree, the needle at key[at].
            left = 0
            while at - left > 0 and i - left > 0 and text[i - left - 1] == key[at - left - 1]:
                left += 1
            right = len(needle)
            while at + right < len(key) and i + right < len(text) and text[i + right] == key[at + right]:
                right += 1
            start, n = at - left, left + right
            if n >= run or (start == 0 and n >= head) or (start + n == len(key) and n >= tail):
                yield i - left, i + right
            i = text.find(needle, i + 1)


def _unbase64(run: bytes) -> bytes:
    """A run of base64, standard or URL-safe, decoded as far as it goes."""
    run = run.rstrip(b"=").replace(b"-", b"+").replace(b"_", b"/")
    run = run[: len(run) - len(run) % 4 if len(run) % 4 == 1 else len(run)]
    try:
        return base64.b64decode(run + b"=" * (-len(run) % 4))
    except ValueError:
        return b""


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
