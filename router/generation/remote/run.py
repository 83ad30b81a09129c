"""One generation job on a model served elsewhere, in OpenAI's dialect or Anthropic's:
the upstream's counterpart of router/generation/run.py.

The job goes out as a streamed chat (or text) completion (outbound.py), or as a streamed
Messages request (anthropic_request.py), through the relay (router/upstream/relay.py), so
replicas, affinity, failover and max_concurrency apply as to a relayed request; the stream
comes back as the internal events (inbound.py, anthropic_events.py) that the route renders
in its own dialect.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import msgspec
import trio

from router.generation.events import Begin, Done, Event, Failed
from router.generation.job import GenerationJob
from router.generation.remote.anthropic_events import MessageReader
from router.generation.remote.anthropic_request import messages_body
from router.generation.remote.inbound import ChunkReader, EventLines, upstream_error
from router.generation.remote.naming import in_request_terms
from router.generation.remote.outbound import chat_body, completion_body
from router.generation.sampling import capped
from router.server import access_log, auth
from router.server.cache_scope import cache_scope
from router.upstream.relay import BrokeOff, Relayed, RelayedBody
from router.upstream.remote import RemoteModel
from supervisor.errors import WorkerCrashed
from worker.protocol import Usage

# The most of an error answer read: enough for any API's error object.
MAX_ERROR_BYTES = 64 * 1024


def _key_capped(job: GenerationJob) -> GenerationJob:
    """The job with its token limit cut to the sending key's `max_tokens`, as a local
    model's is (router/generation/run.py); the limit is then sent, whether or not the
    client set one. A request relayed as it came is not read, and is its upstream's to cap."""
    key = auth.current_key()
    if key is None or key.max_tokens is None:
        return job
    params = capped(job.params, key.max_tokens)
    if params is job.params:
        return job
    sent = None if job.sent is None else job.sent | {"max_tokens"}
    return dataclasses.replace(job, params=params, sent=sent)


class RemoteGeneration:
    """One job on an upstream. `events()` yields its internal events once; `aclose()`
    ends the upstream request (a client that left cancels the generation there) and is
    safe to call more than once."""

    def __init__(self, body: RelayedBody, reader: ChunkReader | MessageReader) -> None:
        self._body = body
        self._reader = reader
        self._record = access_log.current()
        self._counted = False  # the answer's usage is in the access log
        self._stream = self._read()
        self._first: list[Event] = []  # what _begin read

    @classmethod
    async def start(cls, remote: RemoteModel, job: GenerationJob) -> RemoteGeneration:
        """Send the job and wait for the upstream's status and first output, so that its
        refusal (a 400 naming a parameter, a 429) or its failure before it answers is the
        response's status, before any header."""
        reader: ChunkReader | MessageReader
        job = _key_capped(job)
        with in_request_terms(job):
            if remote.speaks == "anthropic":
                body, path = messages_body(job, remote.spec.model), "/v1/messages"
                reader = MessageReader(remote.name)
            else:
                chat = job.messages is not None
                body = chat_body(job, remote.spec.model) if chat else completion_body(job, remote.spec.model)
                path = "/v1/chat/completions" if chat else "/v1/completions"
                reader = ChunkReader(remote.name, chat, job.n)
                if remote.spec.cache_salt and (scope := cache_scope(auth.current_key(), job.cache_salt)):
                    body["cache_salt"] = scope  # the upstream keeps its prefix cache apart per key
        relayed = await send(remote, path, "text/event-stream", body)
        if relayed.status >= 300 or "text/event-stream" not in relayed.headers.get("content-type", ""):
            try:
                text, _ = await read_bounded(relayed.body, MAX_ERROR_BYTES)
            finally:
                await relayed.body.aclose()
            if relayed.status < 300:
                error = WorkerCrashed(
                    f"The upstream of model `{remote.name}` answered a stream request with "
                    f"{relayed.headers.get('content-type', 'no content type')}, not server-sent events."
                )
                relayed.body.broken(error.message)
                raise error
            raise upstream_error(remote.name, relayed.status, text, retry_after_of(relayed.headers))
        generation = cls(relayed.body, reader)
        await generation._begin()
        return generation

    async def _begin(self) -> None:
        """Wait for the answer's first output (text, reasoning, a call, or its end), as a
        local generation's start waits for its first token: an upstream that fails before
        it answers anything (an error right after Anthropic's message_start or an OpenAI
        server's role-only chunk, an empty stream) is the response's status, not a 200
        stream that holds only an error."""
        try:
            async for ev in self._stream:
                self._first.append(ev)
                if not isinstance(ev, Begin):
                    break
            if self._first and isinstance(self._first[-1], Failed):
                raise self._first[-1].error
        except BaseException:
            with trio.CancelScope(shield=True):  # its connection goes back, even when cancelled
                await self._stream.aclose()
                await self.aclose()
            raise

    async def events(self) -> AsyncIterator[Event]:
        try:
            for ev in self._first:
                yield ev
            async for ev in self._stream:
                yield ev
        finally:
            await self._stream.aclose()
            await self.aclose()

    async def _read(self) -> AsyncGenerator[Event, None]:
        lines = EventLines()
        try:
            async for chunk in self._body:
                for data in lines.feed(chunk):
                    for ev in self._reader.feed(data):
                        if self._record is not None and self._record.first_token is None and not isinstance(ev, Begin):
                            self._record.first_token = time.monotonic()
                        self._judge(ev)
                        yield ev
                        if isinstance(ev, Failed):
                            return
            ending = [ev for data in lines.end() for ev in self._reader.feed(data)] + self._reader.end()
            for ev in ending:
                self._judge(ev)
        except (BrokeOff, ValueError) as exc:  # a break, counted by the body; an event too long
            failed = Failed(WorkerCrashed(f"The upstream's answer broke off: {str(exc) or type(exc).__name__}"))
            self._judge(failed)
            yield failed
            return
        finally:
            await self.aclose()
        for ev in ending:
            yield ev

    def _judge(self, ev: Event) -> None:
        """An answer that ends Failed counts against the replica, as a break would,
        unless the upstream said it is busy (a 503 or a 429 to retry); a whole one's usage
        goes to the access log."""
        if isinstance(ev, Failed):
            if isinstance(ev.error, WorkerCrashed):
                self._body.broken(ev.error.message)
        elif isinstance(ev, Done):
            self._count(ev.usage)

    def _count(self, usage: Usage) -> None:
        """The answer's usage into the access log and the metrics, as the upstream told it."""
        self._counted = True
        if self._record is not None:
            self._record.prompt_tokens, self._record.generated_tokens = usage.prompt_tokens, usage.completion_tokens
            self._record.cached_tokens = usage.cached_tokens

    async def aclose(self) -> None:
        # An answer that ends before the upstream's usage (a client gone mid-stream, a
        # break) counts what the reader saw of it, if anything.
        if not self._counted:
            seen = self._reader.so_far()
            if seen.prompt_tokens or seen.completion_tokens:
                self._count(seen)
        await self._body.aclose()


async def send(remote: RemoteModel, path: str, accept: str, body: dict[str, Any]) -> Relayed:
    """A translated request, sent through the relay; the replica that takes it goes into
    the access log."""
    headers = remote.headers_out(accept)
    relayed = await remote.relay.send(remote.spec, remote.key, path, "", headers, msgspec.json.encode(body))
    if relayed is None:  # the hook sends only upstream-only models here
        raise WorkerCrashed(f"The model `{remote.name}` has no upstream to translate for.")
    if (record := access_log.current()) is not None:
        record.upstream = relayed.replica
    return relayed


async def fetch(remote: RemoteModel, path: str, body: dict[str, Any], limit: int) -> tuple[RelayedBody, bytes, bool]:
    """A translated request whose answer is one JSON body (embeddings, a token count): the
    answer's body, its bytes up to `limit` and whether there were more; an answer whose
    status is not a success raises the error it is in the client's terms."""
    relayed = await send(remote, path, "application/json", body)
    try:
        raw, more = await read_bounded(relayed.body, limit)
    finally:
        await relayed.body.aclose()
    if relayed.status >= 300:
        raise upstream_error(remote.name, relayed.status, raw[:MAX_ERROR_BYTES], retry_after_of(relayed.headers))
    return relayed.body, raw, more


async def read_bounded(body: RelayedBody, limit: int) -> tuple[bytes, bool]:
    """An upstream answer's bytes, up to `limit` of them, and whether there were more
    (its reading stops there: the caller closes the body). An answer broken off is the
    upstream's failure, a 502 (the body has logged and counted it)."""
    out = bytearray()  # appended in place: a 200 MB answer copied at every chunk stalled the loop
    try:
        async for chunk in body:
            out += chunk
            if len(out) > limit:
                return bytes(out[:limit]), True
    except BrokeOff:
        raise WorkerCrashed(f"The upstream of model `{body.model}` broke off its answer.") from None
    return bytes(out), False


def retry_after_of(headers: Mapping[str, str]) -> float | None:
    """An answer's Retry-After in seconds, where it gives one."""
    try:
        return max(0.0, float(headers.get("retry-after", "")))
    except ValueError:
        return None
