"""A completion request, from its decoded body to its last token.

`GenerationJob` is what a chat or text completion asks for, decoded and validated once:
everything downstream takes it, not the raw request. `Generation` runs one job on a model:
it owns the lease on the worker and the worker's streams together, and its one `close()`
gives both back, whichever way the response ends.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import msgspec

from router.server import access_log
from router.api.openai import fields as request_fields
from router.api.openai import schemas
from router.server import sse
from router.generation import structured
from router.generation import tool_schemas
from router.generation.chat_output import ChatOutput
from router.generation.choices import Choices, chat_logprobs, completion_logprobs, merged_usage
from router.api.openai.render import Completion
from router.generation.prompts import Prompt
from router.generation.tool_grammar import tool_choice_constraint
from supervisor.connection import RequestStream, WorkerConnection
from supervisor.errors import CorralError, Unsupported
from supervisor.handle import ModelHandle
from supervisor.lease import Lease
from supervisor.slot_queue import Ticket
from worker.protocol import ChatMessage, Constraint, SamplingParams, Timings, TokenEvent, ToolFormat, Usage


@dataclass(frozen=True)
class GenerationJob:
    model: str  # as the client named it (an alias stays an alias in the response)
    params: SamplingParams
    prompt: str | None = None  # a text completion's prompt
    messages: tuple[ChatMessage, ...] | None = None  # a chat's messages
    # llama-server's mixed prompt (token ids and strings), from POST /completion.
    prompt_parts: tuple[int | str, ...] | None = None
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    tools: tool_schemas.ToolRequest = field(default_factory=tool_schemas.ToolRequest)
    template_kwargs: dict[str, Any] | None = None  # chat_template_kwargs
    # A text completion's prompts when they are not one string (token arrays, or several
    # prompts); each gives n choices, choice p*n + j being prompt p's j-th.
    prompt_list: tuple[Prompt, ...] | None = None
    n: int = 1
    echo: bool = False  # completions: each choice's text starts with its prompt's

    @property
    def chat(self) -> bool:
        return self.messages is not None

    @property
    def prompts(self) -> tuple[Prompt | None, ...]:
        """One entry per Generate sent: a prompt, or None for a chat's messages."""
        if self.prompt_list is not None:
            return self.prompt_list
        return (None,) if self.chat or self.prompt_parts is not None else (self.prompt or "",)

    @property
    def logprobs(self) -> bool:
        return self.params.logprobs is not None

    @property
    def timings(self) -> bool:
        """llama-server's timings_per_token: chunks and the answer carry `timings`."""
        return self.params.timings_per_token


def chat_job(r: schemas.ChatRequest, model: str, default_max_tokens: int | None = None) -> GenerationJob:
    """`model` is the name the response gives: the request's, or the default model's;
    `default_max_tokens` the model's limit for a request that sets none."""
    max_tokens = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
    param = "max_tokens"
    if max_tokens is None and r.n_predict is not None:
        max_tokens, param = request_fields.n_predict_tokens(r.n_predict), "n_predict"
    elif max_tokens is None:
        max_tokens = default_max_tokens
    params = request_fields.sampling_params(r, max_tokens, param)
    params = msgspec.structs.replace(params, logprobs=request_fields.chat_logprobs(r))
    return GenerationJob(
        model=model,
        params=_constrained(params, structured.constraint(r.response_format, r.json_schema, r.grammar)),
        messages=tuple(request_fields.chat_messages(r)),
        stream=r.stream,
        include_usage=_include_usage(r),
        tools=tool_schemas.tool_request(r.tools, r.tool_choice, r.parallel_tool_calls),
        template_kwargs=request_fields.chat_template_kwargs(r.chat_template_kwargs),
        n=r.n,
    )


def completion_job(r: schemas.CompletionRequest, model: str, default_max_tokens: int | None = None) -> GenerationJob:
    params = request_fields.sampling_params(r, *_completion_max_tokens(r, default_max_tokens))
    params = msgspec.structs.replace(params, logprobs=request_fields.completion_logprobs(r))
    prompts = request_fields.completion_prompts(r)
    one = prompts[0] if len(prompts) == 1 and isinstance(prompts[0], str) else None
    return GenerationJob(
        model=model,
        params=_constrained(params, structured.constraint(json_schema=r.json_schema, grammar=r.grammar)),
        prompt=one,
        prompt_list=None if one is not None else tuple(prompts),
        stream=r.stream,
        include_usage=_include_usage(r),
        n=r.n,
        echo=r.echo,
    )


def _completion_max_tokens(r: schemas.CompletionRequest, default: int | None) -> tuple[int | None, str]:
    """The token limit and the parameter it came from."""
    if r.max_tokens is not None:
        return r.max_tokens, "max_tokens"
    if r.n_predict is not None:
        return request_fields.n_predict_tokens(r.n_predict), "n_predict"
    # The model's own default, else OpenAI's for the legacy completions endpoint.
    return (default if default is not None else 16), "max_tokens"


def _constrained(params: SamplingParams, c: Constraint | None) -> SamplingParams:
    return params if c is None else msgspec.structs.replace(params, constraint=c)


def _include_usage(r: schemas.SamplingFields) -> bool:
    return bool(r.stream and r.stream_options and r.stream_options.include_usage)


class Generation:
    """One job running on a model's worker. Iterate for its TokenEvents, each with its
    choice's index in the response; every choice ends with an event that has a
    finish_reason; errors raise. `close()` is idempotent and never blocks, so it is safe
    in a `finally` that runs during cancellation: it cancels the generation in the worker
    if it has not finished, and releases the lease (the model may unload again).

    A job of several prompts sends one Generate per prompt (each with n choices), all at
    once; the worker runs them together, and their events are read prompt after prompt
    (a later prompt's events wait in its channel meanwhile)."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._ticket: Ticket | None = None  # its slots, once its turn has come
        self._record: access_log.Record | None = None  # the access log's, to fill in
        self._streams: list[RequestStream] = []
        self._firsts: list[TokenEvent | None] = []
        self._running: list[int] = []  # per stream, choices without their final event
        self._n = 1
        self._at = 0  # the stream being read
        # A chat's parser per choice (content, reasoning, tool calls); None for completions.
        self._tools: ToolFormat | None = None
        self._declared: frozenset[str] | None = None  # the offered functions' names
        self._reasoning = False
        self._outputs: dict[int, ChatOutput] | None = None

    @classmethod
    async def start(cls, handle: ModelHandle, job: GenerationJob) -> Generation:
        """Take a lease (loading the model if needed), send the job, and wait for its first
        event, so that an error such as context_length_exceeded raises here, before a
        response has committed to a status."""
        record = access_log.current()
        asked = time.monotonic()
        gen = cls(await handle.acquire())
        gen._record = record
        try:
            leased = time.monotonic()
            # Each choice of each prompt runs in a slot of its own.
            gen._ticket = await handle.take_slots(gen.conn, len(job.prompts) * job.n)
            if record is not None:
                record.load_wait, record.slot_wait = leased - asked, time.monotonic() - leased
            await gen._begin(job)
        except BaseException:
            gen.close()
            raise
        return gen

    async def _begin(self, job: GenerationJob) -> None:
        conn = self._lease.conn
        ready = conn.ready
        messages = list(job.messages) if job.messages is not None else None
        self._n = job.n
        for prompt in job.prompts:
            text = prompt if isinstance(prompt, str) else None
            if job.prompt_parts is not None:  # its strings alone bound it from below
                text = "".join(p for p in job.prompt_parts if isinstance(p, str))
            if ready is not None and (text is not None or messages is not None):
                request_fields.refuse_if_too_long(
                    ready,
                    request_fields.bounded_text(text, messages),
                    ready.n_ctx_slot - 1,
                    "the prompt",
                    f"this model's context holds {ready.n_ctx_slot} tokens, prompt and output together",
                    "messages" if job.chat else "prompt",
                )
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
        if job.chat:
            self._tools = fmt if tools.offered else None
            if tools.offered:
                self._declared = frozenset(t["function"]["name"] for t in tools.offered)
            self._reasoning = ready is not None and ready.reasoning
            self._outputs = {}
        for prompt in job.prompts:
            stream = conn.generate(
                params,
                prompt=prompt if isinstance(prompt, str) else None,
                messages=messages,
                prompt_parts=list(job.prompt_parts) if job.prompt_parts is not None else None,
                tools=list(tools.offered) if tools.offered else None,
                template_kwargs=job.template_kwargs,
                prompt_tokens=list(prompt) if isinstance(prompt, tuple) else None,
                n=job.n,
                echo=job.echo,
                request_id=self._record.id if self._record is not None else None,
            )
            self._streams.append(stream)
            self._running.append(job.n)
        # Every prompt's first answer before any header: an error in any of them is the
        # response's status.
        for stream in self._streams:
            self._firsts.append(await stream.receive())
        if self._record is not None:
            self._record.first_token = time.monotonic()
            self._record.prompt_tokens = self._record.generated_tokens = 0

    @property
    def conn(self) -> WorkerConnection:
        """The worker this generation runs on, leased until `close()`."""
        return self._lease.conn

    def output(self, ev: TokenEvent) -> ChatOutput | None:
        """The parser of `ev`'s choice (a chat's), made at its first event, which says
        whether the output starts inside reasoning. None for a text completion."""
        if self._outputs is None:
            return None
        out = self._outputs.get(ev.index)
        if out is None:
            out = self._outputs[ev.index] = ChatOutput(
                tools=self._tools, reasoning=self._reasoning, in_reasoning=ev.in_reasoning,
                declared=self._declared,
            )
        return out

    def end_choice(self, index: int) -> None:
        """Stop choice `index` (as the response numbers choices) in the worker: its output
        has ended (ChatOutput.ended). Its final event still comes, with finish_reason
        "cancelled" and its usage; the other choices go on. Never blocks."""
        at, choice = divmod(index, self._n)
        if at < len(self._streams):
            self._streams[at].cancel_choice(choice)

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> TokenEvent:
        while self._at < len(self._streams):
            at = self._at
            if not self._running[at]:
                self._at += 1
                continue
            first = self._firsts[at]
            if first is not None:
                ev, self._firsts[at] = first, None
            else:
                ev = await self._streams[at].receive()
            if ev.finish_reason is not None:
                self._running[at] -= 1
                if self._record is not None and ev.usage is not None:
                    self._count(ev.usage, first_of_prompt=self._running[at] == self._n - 1)
            if at:
                ev = msgspec.structs.replace(ev, index=at * self._n + ev.index)
            return ev
        raise StopAsyncIteration

    def _count(self, usage: Usage, first_of_prompt: bool) -> None:
        """A finished choice's usage into the access log: its generated tokens, and, for
        the first of its prompt's choices to finish, the prompt's tokens (the choices of a
        prompt share it)."""
        assert self._record is not None
        self._record.generated_tokens = (self._record.generated_tokens or 0) + usage.completion_tokens
        if first_of_prompt:
            self._record.prompt_tokens = (self._record.prompt_tokens or 0) + usage.prompt_tokens
            self._record.cached_tokens += usage.cached_tokens

    def close(self) -> None:
        for stream in self._streams:
            stream.close()
        if self._ticket is not None:
            self._ticket.release()
        self._lease.release()


def _cut(worker_reason: str) -> bool:
    """Whether output that ended so was cut short: a call being written is dropped."""
    return worker_reason in ("length", "cancelled")


async def whole(gen: Generation, fmt: Completion, job: GenerationJob) -> bytes:
    """The response body of a non-streamed completion of n choices per prompt. A chat's
    text goes through its choice's parser as it comes, so that a choice whose tool calls
    began repeating is stopped then, not at max_tokens."""
    choices = Choices()
    timings: Timings | None = None
    async for ev in gen:
        choices.add(ev)
        if ev.finish_reason is not None and ev.timings is not None:
            timings = ev.timings
        out = gen.output(ev)
        if out is not None:
            was_ended = out.ended
            if ev.text:
                out.feed(ev.text)
            if out.ended and not was_ended and ev.finish_reason is None:
                gen.end_choice(ev.index)
            if ev.finish_reason is not None:
                out.finish(cut=_cut(ev.finish_reason))
    ordered = choices.ordered()
    for c in ordered:
        out = gen.output(TokenEvent(id=0, index=c.index, in_reasoning=c.in_reasoning))
        if out is not None:
            c.message = out.message()
            c.finish_reason = out.finish_reason(c.finish_reason or "stop")
    return fmt.whole_choices(ordered, choices.usage(job.n), job.logprobs, timings if job.timings else None)


async def events(gen: Generation, fmt: Completion, job: GenerationJob) -> AsyncIterator[bytes]:
    """The SSE events of a streamed completion. Each choice's chunks carry its index and
    its tokens' logprobs; a chat choice's first chunk carries the role, its last the
    finish_reason; a chat's text passes through its choice's parser (reasoning_content,
    tool-call deltas). A failure after the headers is a final error event; the stream then
    ends without [DONE], so a client cannot take a cut answer for a whole one."""
    try:
        started: set[int] = set()
        offsets: dict[int, int] = {}  # completions: each choice's characters so far
        finals: dict[int, Usage] = {}
        for i in range(job.n):  # the first prompt's choices, as before any token
            if fmt.chat:
                yield fmt.chunk("", first=True, index=i)
                started.add(i)
        async for ev in gen:
            i = ev.index
            timings = ev.timings if job.timings else None
            if fmt.chat and i not in started:
                started.add(i)
                yield fmt.chunk("", first=True, index=i)
            text = (ev.echo or "") + ev.text
            lp: dict[str, object] | None = None
            if job.logprobs and ev.logprobs:
                if fmt.chat:
                    lp = chat_logprobs(ev.logprobs)
                else:  # this event's tokens start after the echoed prompt, if it is here
                    lp, _ = completion_logprobs(ev.logprobs, offsets.get(i, 0) + len(ev.echo or ""))
            offsets[i] = offsets.get(i, 0) + len(text)
            out = gen.output(ev)
            reason: str | None = ev.finish_reason
            if out is None:
                if text or lp is not None:
                    yield fmt.chunk(text, index=i, logprobs=lp, timings=timings)
            else:
                was_ended = out.ended
                deltas = out.feed(text) if text else []
                if out.ended and not was_ended and ev.finish_reason is None:
                    gen.end_choice(i)  # its final event follows, "cancelled"
                if ev.finish_reason is not None:
                    deltas += out.finish(cut=_cut(ev.finish_reason))
                    reason = out.finish_reason(ev.finish_reason)
                for n, delta in enumerate(deltas):
                    # The logprobs ride with the first chunk of the text they cover.
                    yield fmt.delta_chunk(delta, index=i, logprobs=lp if n == 0 else None, timings=timings)
                if not deltas and lp is not None:
                    yield fmt.delta_chunk({}, index=i, logprobs=lp, timings=timings)
            if reason is not None:
                yield fmt.chunk(None, reason, index=i, timings=timings)
                if ev.usage is not None:
                    finals[i] = ev.usage
        if job.include_usage:
            yield fmt.usage_chunk(merged_usage(finals, job.n))
        yield sse.DONE
    except CorralError as exc:
        yield sse.error_event(exc)
