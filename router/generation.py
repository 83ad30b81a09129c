"""A completion request, from its decoded body to its last token.

`GenerationJob` is what a chat or text completion asks for, decoded and validated once:
everything downstream takes it, not the raw request. `Generation` runs one job on a model:
it owns the lease on the worker and the worker's stream together, and its one `close()`
gives both back, whichever way the response ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

import msgspec

from router import schemas, sse, structured
from router.openai_format import Completion
from supervisor.connection import RequestStream
from supervisor.errors import CorralError
from supervisor.handle import ModelHandle
from supervisor.lease import Lease
from worker.protocol import ChatMessage, Constraint, SamplingParams, TokenEvent


@dataclass(frozen=True)
class GenerationJob:
    model: str  # as the client named it (an alias stays an alias in the response)
    params: SamplingParams
    prompt: str | None = None  # a text completion's prompt
    messages: tuple[ChatMessage, ...] | None = None  # a chat's messages
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage

    @property
    def chat(self) -> bool:
        return self.messages is not None


def chat_job(r: schemas.ChatRequest) -> GenerationJob:
    max_tokens = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
    params = schemas.sampling_params(r, max_tokens)
    return GenerationJob(
        model=r.model,
        params=_constrained(params, structured.constraint(r.response_format, r.json_schema, r.grammar)),
        messages=tuple(schemas.chat_messages(r)),
        stream=r.stream,
        include_usage=_include_usage(r),
    )


def completion_job(r: schemas.CompletionRequest) -> GenerationJob:
    # OpenAI's default for the legacy completions endpoint.
    params = schemas.sampling_params(r, r.max_tokens if r.max_tokens is not None else 16)
    return GenerationJob(
        model=r.model,
        params=_constrained(params, structured.constraint(json_schema=r.json_schema, grammar=r.grammar)),
        prompt=schemas.completion_prompt(r),
        stream=r.stream,
        include_usage=_include_usage(r),
    )


def _constrained(params: SamplingParams, c: Constraint | None) -> SamplingParams:
    return params if c is None else msgspec.structs.replace(params, constraint=c)


def _include_usage(r: schemas._Sampling) -> bool:
    return bool(r.stream and r.stream_options and r.stream_options.include_usage)


class Generation:
    """One job running on a model's worker. Iterate for its TokenEvents, the last one with
    a finish_reason; errors raise. `close()` is idempotent and never blocks, so it is safe
    in a `finally` that runs during cancellation: it cancels the generation in the worker
    if it has not finished, and releases the lease (the model may unload again)."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._stream: RequestStream | None = None
        self._first: TokenEvent | None = None
        self._done = False

    @classmethod
    async def start(cls, handle: ModelHandle, job: GenerationJob) -> Generation:
        """Take a lease (loading the model if needed), send the job, and wait for its first
        event, so that an error such as context_length_exceeded raises here, before a
        response has committed to a status."""
        gen = cls(await handle.acquire())
        try:
            await gen._begin(job)
        except BaseException:
            gen.close()
            raise
        return gen

    async def _begin(self, job: GenerationJob) -> None:
        conn = self._lease.conn
        ready = conn.ready
        messages = list(job.messages) if job.messages is not None else None
        if ready is not None:
            schemas.refuse_if_too_long(
                ready,
                schemas.bounded_text(job.prompt, messages),
                ready.n_ctx_slot - 1,
                "the prompt",
                f"this model's context holds {ready.n_ctx_slot} tokens, prompt and output together",
                "messages" if job.chat else "prompt",
            )
        self._stream = conn.generate(job.params, prompt=job.prompt, messages=messages)
        self._first = await self._stream.receive()

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._done or self._stream is None:
            raise StopAsyncIteration
        if self._first is not None:
            ev, self._first = self._first, None
        else:
            ev = await self._stream.receive()
        self._done = ev.finish_reason is not None
        return ev

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._lease.release()


async def whole(gen: Generation, fmt: Completion) -> bytes:
    """The response body of a non-streamed completion."""
    parts: list[str] = []
    last: TokenEvent | None = None
    async for last in gen:
        parts.append(last.text)
    assert last is not None and last.finish_reason is not None
    return fmt.whole("".join(parts), last.finish_reason, last.usage)


async def events(gen: Generation, fmt: Completion, include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE events of a streamed completion. A failure after the headers is a final
    error event; the stream then ends without [DONE], so a client cannot take a cut
    answer for a whole one."""
    try:
        if fmt.chat:
            yield fmt.chunk("", first=True)
        last: TokenEvent | None = None
        async for last in gen:
            if last.text:
                yield fmt.chunk(last.text)
        assert last is not None
        yield fmt.chunk(None, last.finish_reason)
        if include_usage:
            yield fmt.usage_chunk(last.usage)
        yield sse.DONE
    except CorralError as exc:
        yield sse.error_event(exc)
