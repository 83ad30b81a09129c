"""Relaying a request to an upstream replica in the dialect it came in, and its answer
back as it arrives.

The body goes as it came (the `model` name changed only when the upstream knows the model
by another name), so that whatever the upstream supports of its dialect works, fields
Corral does not know included. The answer streams back chunk by chunk: nothing is
buffered, so a stream's first token reaches the client when the upstream sends it.

Failover: a replica that cannot be reached, drops the connection or answers 5xx before
the answer's first byte has been passed on is marked (router/upstream/health.py) and the
next replica in the request's affinity order takes the request, until none is left. After
the first byte nothing can be taken back: a connection that breaks mid-answer ends the
client's connection too (no final chunk), so a cut answer is never taken for a whole one.
A client that disconnects closes the upstream connection, which cancels the generation
there (Corral and llama-server both stop a request whose client went away).

What the upstream answers (its headers, its body, the text of a transport error) is
scrubbed of every configured key here, where it enters (router/upstream/scrub.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import trio

from router.server import access_log
from router.upstream.choice import pick
from router.upstream.pool import LOCAL, Upstreams
from router.upstream.scrub import StreamScrub, scrubbed_errors
from supervisor.config.schema import UpstreamSpec
from supervisor.errors import CorralError, Overloaded, WorkerCrashed, WorkerUnavailable

log = logging.getLogger("corral.upstream")


class BrokeOff(Exception):
    """An upstream's answer broke off after some of it was passed on. Raised out of the
    body, so that the client's connection ends without a last chunk (a cut answer is never
    taken for a whole one); already logged in one line, so the ASGI server's "Error in ASGI
    Framework" traceback for it is dropped (quiet_breaks), and the access log marks the
    request `upstream-broke`, not `client-gone`."""


class _NotBreaks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        return not isinstance(exc, BrokeOff)


def quiet_breaks(logger: logging.Logger) -> None:
    """Drop the ASGI server's traceback for a BrokeOff from `logger` (idempotent)."""
    if not any(isinstance(f, _NotBreaks) for f in logger.filters):
        logger.addFilter(_NotBreaks())

# Request headers passed on: what the dialects read (content type, versions and betas of
# the Anthropic and OpenAI APIs, a session for the upstream's own affinity, an id to
# follow a request through logs). Never the client's key or cookies: the upstream gets
# the key the config gives it.
FORWARDED = (
    "content-type", "accept", "user-agent", "anthropic-version", "anthropic-beta", "openai-beta",
    "x-session-id", "x-conversation-id", "x-request-id",
)
# The version of Anthropic's API that Corral's own requests to an upstream speak (its
# translation, router/generation/remote/, and its health checks): that API refuses a
# request without the header.
ANTHROPIC_VERSION = "2023-06-01"
# Response headers passed back; hop-by-hop ones and the length (the answer is re-chunked)
# are not. The encoding is, for an upstream that compresses although asked not to: the
# bytes are passed on as they came, so the client must know how to read them.
RETURNED = (
    "content-type", "content-encoding", "cache-control", "x-request-id", "request-id", "retry-after",
    "x-should-retry", "openai-processing-ms", "anthropic-ratelimit-requests-remaining",
)
# Answers that say the replica cannot serve now, whatever the request: tried elsewhere,
# and counted against its health (nginx's proxy_next_upstream http_502 http_503 http_504).
# Any other status is the upstream's answer to this request, passed on: a 500 or a 501
# that a request provokes must not let one client take every replica out of rotation.
UNAVAILABLE = frozenset({502, 503, 504})

# Each relay adds itself to the request's Via header (RFC 9110, 7.6.3), so that an
# upstream that leads back to a server the request has passed (a config that points a
# model at its own server, or two fronts at each other) is refused at once instead of
# multiplying the request.
VIA_TOKEN = "corral-"
MAX_HOPS = 8

@dataclass(frozen=True)
class Relayed:
    """An upstream's answer, its body still to be read as `body` yields it."""

    status: int
    headers: dict[str, str]
    body: RelayedBody
    replica: str


def upstream_url(base: str, path: str, query: str) -> str:
    """Where a request for `path` goes: the base URL names the OpenAI routes' root (".../v1"),
    and every dialect's path is taken from the server's root, as the client sent it (so
    /v1/messages, /api/chat and /completion all reach the same server's routes)."""
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    return root + path + (f"?{query}" if query else "")


def request_headers(headers: Mapping[str, str], api_key: str | None, via: str | None = None) -> dict[bytes, bytes]:
    """The headers to send upstream. Values go as the bytes they came as (HTTP headers are
    Latin-1 on the wire; a client's non-ASCII user-agent is not an error of ours)."""
    out = {k.encode(): v.encode("latin-1", "replace") for k in FORWARDED if (v := headers.get(k)) is not None}
    out[b"accept-encoding"] = b"identity"  # relayed as it comes, with no decoding on the way
    if via is not None:
        before = headers.get("via")
        out[b"via"] = (f"{before}, {via}" if before else via).encode("latin-1", "replace")
    if api_key is not None:  # ASCII: the config refuses any other key
        out[b"authorization"] = f"Bearer {api_key}".encode()
        out[b"x-api-key"] = api_key.encode()  # Anthropic's header, for an Anthropic-dialect upstream
    return out


def loop_problem(via: str | None, own: str) -> str | None:
    """Why a request that arrived with this Via header must not be relayed (None: it may)."""
    if not via:
        return None
    hops = [part.strip().split()[-1] for part in via.split(",") if part.strip()]
    if own in hops:
        return "it has passed through this server already: an upstream leads back to it"
    if sum(h.startswith(VIA_TOKEN) for h in hops) >= MAX_HOPS:
        return f"it has passed through {MAX_HOPS} Corral servers already"
    return None


class Relay:
    def __init__(self, upstreams: Upstreams, client: httpx.AsyncClient, via: str) -> None:
        self.upstreams = upstreams
        self.client = client
        self.via = via  # this server's entry in Via: "1.1 corral-<id>"

    async def send(
        self, spec: UpstreamSpec, key: str, path: str, query: str, headers: Mapping[str, str], body: bytes
    ) -> Relayed | None:
        """Send the request to the replica the choice gives, failing over until one
        answers (anything but UNAVAILABLE) or none is left. None: the choice is the local worker, which the
        caller serves as any local request. Raises the 503 or 429 that says why none could
        take it."""
        tried: set[str] = set()
        last_error: str | None = None
        while True:
            replica = pick(self.upstreams.replicas(spec), key, frozenset(tried))
            if replica is None:
                raise self._none_left(spec, tried, last_error)
            if replica.name == LOCAL:
                return None
            tried.add(replica.name)
            scrubber = self.upstreams.scrubber()
            state = self.upstreams.of(spec.name, replica.name)
            state.in_flight += 1
            handed_over = False
            try:
                url = upstream_url(replica.name, path, query)
                request = self.client.build_request(
                    "POST", url, headers=request_headers(headers, spec.api_key, self.via), content=body,
                    timeout=httpx.Timeout(spec.timeout, connect=min(spec.timeout, 10.0)),
                )
                try:
                    with scrubbed_errors(scrubber):
                        response = await self.client.send(request, stream=True)
                except httpx.TransportError as exc:
                    error = _describe(exc)
                    last_error = f"{replica.name}: {error}"
                    self.upstreams.observe(spec.name, replica.name, False, error, dead=isinstance(exc, httpx.ConnectError))
                    state.outcomes["failed_over"] += 1
                    log.warning("upstream %s of model %s failed before answering (%s); trying another", replica.name, spec.name, last_error)
                    continue
                # Only these, scrubbed of the keys, are read of the answer's headers from here on.
                headers = {k: scrubber.text(v) for k, v in response.headers.items()}
                if response.status_code in UNAVAILABLE and pick(self.upstreams.replicas(spec), key, frozenset(tried)):
                    error = f"answered {response.status_code}"
                    last_error = f"{replica.name}: {error}"
                    await _discard(response)
                    self.upstreams.observe(spec.name, replica.name, False, error)
                    state.outcomes["failed_over"] += 1
                    log.warning("upstream %s of model %s answered %d; trying another", replica.name, spec.name, response.status_code)
                    continue
                if (refused := unrelayable(spec.name, response.status_code, headers)) is not None:
                    await _discard(response)
                    state.outcomes["failed"] += 1
                    if response.status_code in UNAVAILABLE:
                        self.upstreams.observe(spec.name, replica.name, False, f"answered {response.status_code}")
                    log.warning(
                        "upstream %s of model %s answered %d (%s): not passed on", replica.name, spec.name,
                        response.status_code, headers.get("content-type", "no content type"),
                    )
                    raise refused
                handed_over = True
                # A body compressed although none was asked for is passed on decoded: the
                # scrub must see its bytes (the client gets no content-encoding then).
                decode = bool(_encodings(headers))
                return Relayed(
                    response.status_code,
                    {k: v for k in RETURNED if (v := headers.get(k)) is not None and not (decode and k == "content-encoding")},
                    RelayedBody(self.upstreams, spec.name, replica.name, response, scrubber.stream(), decode),
                    replica.name,
                )
            finally:
                if not handed_over:
                    state.in_flight -= 1

    def _none_left(self, spec: UpstreamSpec, tried: set[str], last_error: str | None) -> Exception:
        states = [self.upstreams.of(spec.name, url) for url in spec.urls]
        # Which hosts, and what they said, is the operator's (the log, /admin/models), as a
        # local model's file path is: the client learns the model's name and the count.
        if tried:
            log.warning("no replica of model %s answered (last: %s)", spec.name, last_error)
            return WorkerUnavailable(
                f"No replica of model `{spec.name}` answered ({len(tried)} tried).", retry_after=1.0
            )
        if any(s.health.healthy for s in states):
            return Overloaded(
                f"Every replica of model `{spec.name}` has max_concurrency = {spec.max_concurrency} requests in flight.",
                retry_after=1.0,
            )
        return WorkerUnavailable(
            f"No replica of model `{spec.name}` is in rotation ({len(states)} failing their health checks).",
            retry_after=5.0,
        )


class RelayedBody:
    """An upstream's answer as the client's body, chunk by chunk as it arrives. Its end is
    counted once, however it comes: read to the end, broken off upstream, or closed by a
    client that left, iterated or not (as router/server/sse.py's Body: an async generator
    that never started never runs its `finally`, and Quart closes a body whether or not it
    read it; here the close awaits the connection's)."""

    def __init__(
        self, upstreams: Upstreams, model: str, replica: str, response: httpx.Response, scrub: StreamScrub,
        decode: bool = False,
    ) -> None:
        self._upstreams, self._model, self._replica, self._response = upstreams, model, replica, response
        # Raw, as it came (identity was asked for), unless it came compressed anyway.
        self._chunks = response.aiter_bytes() if decode else response.aiter_raw()
        self._scrub = scrub
        self._ended = False  # the upstream's last chunk has come
        self._broke = False
        self._closed = False
        self._counted: str | None = None  # the outcome its end was counted as
        self._record = access_log.current()  # made in the request, read when the body breaks

    def __aiter__(self) -> RelayedBody:
        return self

    async def __anext__(self) -> bytes:
        """The next chunk, scrubbed of the keys; a chunk that is all held back (the start of
        what may be a key) is not given as an empty one: the next one is read."""
        try:
            while not self._ended:
                with scrubbed_errors(self._scrub.scrubber):
                    try:
                        chunk = await self._chunks.__anext__()
                    except httpx.DecodingError as exc:  # a compressed body that does not decode
                        raise httpx.RemoteProtocolError(f"its body does not decode: {exc}") from None
                if out := self._scrub.feed(chunk):
                    return out
        except httpx.TransportError as exc:
            self._broke = True
            log.warning("upstream %s of model %s broke off its answer: %s", self._replica, self._model, _describe(exc))
            self._upstreams.observe(self._model, self._replica, False, _describe(exc), dead=isinstance(exc, httpx.ConnectError))
            if self._record is not None:
                self._record.upstream_broke = True
            await self.aclose()
            raise BrokeOff(f"upstream {self._replica} of model {self._model} broke off its answer") from None
        except StopAsyncIteration:
            self._ended = True
            await self.aclose()
            if rest := self._scrub.end():
                return rest
        raise StopAsyncIteration

    @property
    def model(self) -> str:
        """The model whose upstream answers."""
        return self._model

    def broken(self, why: str) -> None:
        """The answer came whole over HTTP but is not a whole answer (a stream cut before
        its end, an event that is not JSON): the replica's failure, counted as a break,
        also once its end has been counted as a good one (its reader learns it last)."""
        if self._broke:
            return
        self._broke = True
        log.warning("upstream %s of model %s sent a broken answer: %s", self._replica, self._model, why)
        if self._counted == "ok":
            state = self._upstreams.of(self._model, self._replica)
            state.outcomes["ok"] -= 1
            state.outcomes["failed"] += 1
            state.outcomes += Counter()  # a count taken back to 0 is dropped
            self._counted = "failed"
        self._upstreams.observe(self._model, self._replica, False, why)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # A client that left is not the replica's failure: only a break or a 5xx is.
        status = self._response.status_code
        state = self._upstreams.of(self._model, self._replica)
        state.in_flight -= 1
        self._counted = "failed" if self._broke or status >= 500 else "ok"
        state.outcomes[self._counted] += 1
        if not self._broke:
            unavailable = status in UNAVAILABLE
            self._upstreams.observe(self._model, self._replica, not unavailable, f"answered {status}" if unavailable else None)
        await _discard(self._response)


def unrelayable(model: str, status: int, headers: Mapping[str, str]) -> CorralError | None:
    """The error the client gets instead of an upstream answer that must not be passed on
    (None: pass it on).
    - A redirect is a base URL to fix, not an answer: its Location would send the client to
      the upstream, around the front.
    - A 5xx no client of any dialect can read (a proxy's HTML page, say) becomes the
      failure in the client's own dialect's shape: 503 for the statuses that say
      "unavailable", else 502."""
    if 300 <= status < 400:
        return WorkerCrashed(
            f"The upstream of model `{model}` answered a redirect ({status}) "
            f"to {headers.get('location', '?')}; its `upstream` URL must name the server itself."
        )
    if status >= 500 and not _json_or_events(headers.get("content-type")):
        message = f"The upstream of model `{model}` failed ({status})."
        return WorkerUnavailable(message, retry_after=1.0) if status in UNAVAILABLE else WorkerCrashed(message)
    if _encodings(headers) - _READABLE:
        # Asked for none, it compressed anyway, in a way Corral cannot read: a body whose
        # keys no scrub could see is not passed on.
        return WorkerCrashed(
            f"The upstream of model `{model}` answered with content-encoding "
            f"{headers.get('content-encoding')!r}, which Corral cannot read."
        )
    return None


# The content codings httpx decodes with no extra package.
_READABLE = frozenset({"gzip", "deflate"})


def _encodings(headers: Mapping[str, str]) -> set[str]:
    """The content codings an answer says it was sent with, beyond `identity`."""
    value = headers.get("content-encoding", "")
    return {c.strip().lower() for c in value.split(",") if c.strip() and c.strip().lower() != "identity"}


async def _discard(response: httpx.Response) -> None:
    """Close an upstream answer, even from a cancelled request: its connection must go back."""
    with trio.CancelScope(shield=True):
        await response.aclose()


def _json_or_events(content_type: str | None) -> bool:
    """Whether an answer's body is one a dialect's client reads: JSON (NDJSON for Ollama's
    streams) or server-sent events."""
    kind = (content_type or "").split(";")[0].strip().lower()
    return kind in ("application/json", "application/x-ndjson", "text/event-stream") or kind.endswith("+json")


def _describe(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 200 else text[:200] + "…"

