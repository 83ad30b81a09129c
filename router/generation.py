"""A completion request, from its decoded body to its last token.

`GenerationJob` is what a chat or text completion asks for, decoded and validated once:
everything downstream takes it, not the raw request. `Generation` runs one job on a model:
it owns the lease on the worker and the worker's stream together, and its one `close()`
gives both back, whichever way the response ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import msgspec

from router import schemas, sse, structured, tool_schemas
from router.chat_output import ChatOutput
from router.openai_format import Completion
from router.tool_grammar import tool_choice_constraint
from supervisor.connection import RequestStream, WorkerConnection
from supervisor.errors import CorralError, Unsupported
from supervisor.handle import ModelHandle
from supervisor.lease import Lease
from worker.protocol import ChatMessage, Constraint, SamplingParams, TokenEvent


@dataclass(frozen=True)
class GenerationJob:
    model: str  # as the client named it (an alias stays an alias in the response)
    params: SamplingParams
    prompt: str | None = None  # a text completion's prompt
    messages: tuple[ChatMessage, ...] | None = None  # a chat's messages
    # llama-server's mixed prompt (/completion): token ids, and strings tokenized in place
    prompt_parts: tuple[int | str, ...] | None = None
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    tools: tool_schemas.ToolRequest = field(default_factory=tool_schemas.ToolRequest)
    template_kwargs: dict[str, Any] | None = None  # chat_template_kwargs

    @property
    def timings(self) -> bool:
        """llama-server's timings_per_token: chunks and the answer carry `timings`."""
        return self.params.timings_per_token

    @property
    def chat(self) -> bool:
        return self.messages is not None


def chat_job(r: schemas.ChatRequest, model: str) -> GenerationJob:
    """`model` is the name the response gives: the request's, or the default model's."""
    max_tokens = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
    param = "max_tokens"
    if max_tokens is None and r.n_predict is not None:
        max_tokens, param = schemas.n_predict_tokens(r.n_predict), "n_predict"
    params = schemas.sampling_params(r, max_tokens, param)
    return GenerationJob(
        model=model,
        params=_constrained(params, structured.constraint(r.response_format, r.json_schema, r.grammar)),
        messages=tuple(schemas.chat_messages(r)),
        stream=r.stream,
        include_usage=_include_usage(r),
        tools=tool_schemas.tool_request(r.tools, r.tool_choice, r.parallel_tool_calls),
        template_kwargs=r.chat_template_kwargs,
    )


def completion_job(r: schemas.CompletionRequest, model: str) -> GenerationJob:
    params = schemas.sampling_params(r, *_completion_max_tokens(r))
    return GenerationJob(
        model=model,
        params=_constrained(params, structured.constraint(json_schema=r.json_schema, grammar=r.grammar)),
        prompt=schemas.completion_prompt(r),
        stream=r.stream,
        include_usage=_include_usage(r),
    )


def _completion_max_tokens(r: schemas.CompletionRequest) -> tuple[int | None, str]:
    """The token limit and the parameter it came from."""
    if r.max_tokens is not None:
        return r.max_tokens, "max_tokens"
    if r.n_predict is not None:
        return schemas.n_predict_tokens(r.n_predict), "n_predict"
    return 16, "max_tokens"  # OpenAI's default for the legacy completions endpoint


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
        self.output: ChatOutput | None = None  # a chat's parts, once the first event is in

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
            text = job.prompt
            if job.prompt_parts is not None:  # its strings alone bound it from below
                text = "".join(p for p in job.prompt_parts if isinstance(p, str))
            schemas.refuse_if_too_long(
                ready,
                schemas.bounded_text(text, messages),
                ready.n_ctx_slot - 1,
                "the prompt",
                f"this model's context holds {ready.n_ctx_slot} tokens, prompt and output together",
                "messages" if job.chat else "prompt",
            )
        if job.prompt_parts is not None:
            self._stream = conn.generate(job.params, prompt_parts=list(job.prompt_parts))
            self._first = await self._stream.receive()
            return
        params, tools = job.params, job.tools
        fmt = ready.tool_format if ready is not None else None
        if tools.offered and ready is not None:
            if fmt is None:
                raise Unsupported(
                    "This model's built-in chat template cannot take tools; set tool_format = "
                    '"generic" or a Jinja chat_template in its config.',
                    "tools",
                )
            if tools.forced:
                params = msgspec.structs.replace(
                    params, constraint=tool_choice_constraint(fmt, tools.forced, tools.parallel)
                )
        self._stream = conn.generate(
            params,
            prompt=job.prompt,
            messages=messages,
            tools=list(tools.offered) if tools.offered else None,
            template_kwargs=job.template_kwargs,
        )
        self._first = await self._stream.receive()
        if job.chat:
            self.output = ChatOutput(
                tools=fmt if tools.offered else None,
                reasoning=ready is not None and ready.reasoning,
                in_reasoning=self._first.in_reasoning,
            )

    @property
    def conn(self) -> WorkerConnection:
        """The worker this generation runs on, leased until `close()`."""
        return self._lease.conn

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


async def whole(gen: Generation, fmt: Completion, timings: bool = False) -> bytes:
    """The response body of a non-streamed completion."""
    parts: list[str] = []
    last: TokenEvent | None = None
    async for last in gen:
        parts.append(last.text)
    assert last is not None and last.finish_reason is not None
    shown = last.timings if timings else None
    out = gen.output
    if out is None:
        return fmt.whole("".join(parts), last.finish_reason, last.usage, shown)
    out.feed("".join(parts))
    out.finish()
    return fmt.whole("", out.finish_reason(last.finish_reason), last.usage, shown, message=out.message())


async def events(gen: Generation, fmt: Completion, include_usage: bool, timings: bool = False) -> AsyncIterator[bytes]:
    """The SSE events of a streamed completion. A failure after the headers is a final
    error event; the stream then ends without [DONE], so a client cannot take a cut
    answer for a whole one."""
    try:
        if fmt.chat:
            yield fmt.chunk("", first=True)
        last: TokenEvent | None = None
        out = gen.output
        async for last in gen:
            if not last.text:
                continue
            if out is None:
                yield fmt.chunk(last.text, timings=last.timings if timings else None)
            else:
                for delta in out.feed(last.text):
                    yield fmt.delta_chunk(delta, timings=last.timings if timings else None)
        assert last is not None and last.finish_reason is not None
        reason: str = last.finish_reason
        if out is not None:
            for delta in out.finish():
                yield fmt.delta_chunk(delta, timings=last.timings if timings else None)
            reason = out.finish_reason(reason)
        yield fmt.chunk(None, reason, timings=last.timings if timings else None)
        if include_usage:
            yield fmt.usage_chunk(last.usage)
        yield sse.DONE
    except CorralError as exc:
        yield sse.error_event(exc)
