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

from router import schemas, sse
from router.choices import Choices, chat_logprobs, completion_logprobs, merged_usage
from router.openai_format import Completion
from router.prompts import Prompt
from supervisor.connection import RequestStream
from supervisor.errors import CorralError
from supervisor.handle import ModelHandle
from supervisor.lease import Lease
from worker.protocol import ChatMessage, SamplingParams, TokenEvent, Usage


@dataclass(frozen=True)
class GenerationJob:
    model: str  # as the client named it (an alias stays an alias in the response)
    params: SamplingParams
    prompt: str | None = None  # a text completion's prompt
    messages: tuple[ChatMessage, ...] | None = None  # a chat's messages
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
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
        return (None,) if self.chat else (self.prompt or "",)

    @property
    def logprobs(self) -> bool:
        return self.params.logprobs is not None


def chat_job(r: schemas.ChatRequest) -> GenerationJob:
    max_tokens = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
    params = schemas.sampling_params(r, max_tokens)
    return GenerationJob(
        model=r.model,
        params=msgspec.structs.replace(params, logprobs=schemas.chat_logprobs(r)),
        messages=tuple(schemas.chat_messages(r)),
        stream=r.stream,
        include_usage=_include_usage(r),
        n=r.n,
    )


def completion_job(r: schemas.CompletionRequest) -> GenerationJob:
    # OpenAI's default for the legacy completions endpoint.
    params = schemas.sampling_params(r, r.max_tokens if r.max_tokens is not None else 16)
    prompts = schemas.completion_prompts(r)
    one = prompts[0] if len(prompts) == 1 and isinstance(prompts[0], str) else None
    return GenerationJob(
        model=r.model,
        params=msgspec.structs.replace(params, logprobs=schemas.completion_logprobs(r)),
        prompt=one,
        prompt_list=None if one is not None else tuple(prompts),
        stream=r.stream,
        include_usage=_include_usage(r),
        n=r.n,
        echo=r.echo,
    )


def _include_usage(r: schemas._Sampling) -> bool:
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
        self._streams: list[RequestStream] = []
        self._firsts: list[TokenEvent | None] = []
        self._running: list[int] = []  # per stream, choices without their final event
        self._n = 1
        self._at = 0  # the stream being read

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
        self._n = job.n
        for prompt in job.prompts:
            text = prompt if isinstance(prompt, str) else None
            if ready is not None and (text is not None or messages is not None):
                schemas.refuse_if_too_long(
                    ready,
                    schemas.bounded_text(text, messages),
                    ready.n_ctx_slot - 1,
                    "the prompt",
                    f"this model's context holds {ready.n_ctx_slot} tokens, prompt and output together",
                    "messages" if job.chat else "prompt",
                )
        for prompt in job.prompts:
            stream = conn.generate(
                job.params,
                prompt=prompt if isinstance(prompt, str) else None,
                messages=messages,
                prompt_tokens=list(prompt) if isinstance(prompt, tuple) else None,
                n=job.n,
                echo=job.echo,
            )
            self._streams.append(stream)
            self._running.append(job.n)
        # Every prompt's first answer before any header: an error in any of them is the
        # response's status.
        for stream in self._streams:
            self._firsts.append(await stream.receive())

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
            if at:
                ev = msgspec.structs.replace(ev, index=at * self._n + ev.index)
            return ev
        raise StopAsyncIteration

    def close(self) -> None:
        for stream in self._streams:
            stream.close()
        self._lease.release()


async def whole(gen: Generation, fmt: Completion, n: int = 1, logprobs: bool = False) -> bytes:
    """The response body of a non-streamed completion of n choices per prompt."""
    choices = Choices()
    async for ev in gen:
        choices.add(ev)
    return fmt.whole_choices(choices.ordered(), choices.usage(n), logprobs)


async def events(
    gen: Generation, fmt: Completion, include_usage: bool, n: int = 1, logprobs: bool = False
) -> AsyncIterator[bytes]:
    """The SSE events of a streamed completion. Each choice's chunks carry its index and
    its tokens' logprobs; a chat choice's first chunk carries the role, its last the
    finish_reason. A failure after the headers is a final error event; the stream then
    ends without [DONE], so a client cannot take a cut answer for a whole one."""
    try:
        started: set[int] = set()
        offsets: dict[int, int] = {}  # completions: each choice's characters so far
        finals: dict[int, Usage] = {}
        for i in range(n):  # the first prompt's choices, as before any token
            if fmt.chat:
                yield fmt.chunk("", first=True, index=i)
                started.add(i)
        async for ev in gen:
            i = ev.index
            if fmt.chat and i not in started:
                started.add(i)
                yield fmt.chunk("", first=True, index=i)
            text = (ev.echo or "") + ev.text
            lp: dict[str, object] | None = None
            if logprobs and ev.logprobs:
                if fmt.chat:
                    lp = chat_logprobs(ev.logprobs)
                else:  # this event's tokens start after the echoed prompt, if it is here
                    lp, _ = completion_logprobs(ev.logprobs, offsets.get(i, 0) + len(ev.echo or ""))
            offsets[i] = offsets.get(i, 0) + len(text)
            if text or lp is not None:
                yield fmt.chunk(text, index=i, logprobs=lp)
            if ev.finish_reason is not None:
                yield fmt.chunk(None, ev.finish_reason, index=i)
                if ev.usage is not None:
                    finals[i] = ev.usage
        if include_usage:
            yield fmt.usage_chunk(merged_usage(finals, n))
        yield sse.DONE
    except CorralError as exc:
        yield sse.error_event(exc)
