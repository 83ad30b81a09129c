"""A running generation's TokenEvents turned into the internal event stream
(router/generation/events.py), which every dialect renders.

A chat's text passes through its choice's parser (router/generation/chat_output.py):
reasoning is split off and tool calls are parsed here, once, for every dialect. A choice
whose calls began repeating is stopped in the worker then, not at max_tokens. A failure
after the first event is the stream's last event (`Failed`), never an exception, so that a
renderer that has sent its headers can still say that the answer is cut.
"""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator

from router.generation.chat_output import ChatOutput
from router.generation.events import (
    Begin, Delta, Done, Event, Failed, Finish, Reason, ReasoningDelta, TextDelta, ToolCallStart,
)
from router.generation.job import GenerationJob
from router.generation.run import Generation
from supervisor.errors import CorralError
from worker.protocol import FinishReason, Timings, TokenEvent, TokenLogprob, Usage

_NO_USAGE = Usage(prompt_tokens=0, completion_tokens=0)


def merged_usage(finals: dict[int, Usage], n: int) -> Usage:
    """The usage of a response whose choice `i` ended with `finals[i]`: choices
    p*n .. p*n+n-1 share prompt p, which counts once (its cached tokens as choice p*n,
    the one that evaluated it, saw them); completion tokens add up over every choice."""
    prompt = cached = completion = 0
    for i, u in finals.items():
        completion += u.completion_tokens
        if i % n == 0:
            prompt += u.prompt_tokens
            cached += u.cached_tokens
    return Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


def _cut(worker_reason: FinishReason) -> bool:
    """Whether output that ended so was cut short: a call being written is dropped."""
    return worker_reason in ("length", "cancelled")


async def events(gen: Generation, job: GenerationJob) -> AsyncIterator[Event]:
    """The job's events, from `Begin` of the first prompt's choices to `Done` (or
    `Failed`). Logprobs and per-token timings are on the deltas only when the job asked for
    them."""
    try:
        outputs: dict[int, ChatOutput] = {}
        finals: dict[int, Usage] = {}
        begun: set[int] = set()
        for i in range(job.n):  # the first prompt's choices begin before any token
            begun.add(i)
            yield Begin(i, gen.prompt_usage)
        async for ev in gen:
            i = ev.index
            if i not in begun:
                begun.add(i)
                yield Begin(i)
            timings = ev.timings if job.timings else None
            logprobs = tuple(ev.logprobs) if job.logprobs else ()
            reason: Reason | None = ev.finish_reason
            if gen.parsing is None:
                yield TextDelta(
                    i, ev.text, tuple(ev.tokens), logprobs, timings, echo=ev.echo or "", last=reason is not None
                )
            else:
                out = outputs.get(i)
                if out is None:  # its first event says whether it starts inside reasoning
                    p = gen.parsing
                    out = outputs[i] = ChatOutput(
                        tools=p.tools, reasoning=p.reasoning, in_reasoning=ev.in_reasoning, declared=p.declared, choice=i,
                        param_types=p.param_types, harmony=p.harmony, reasoning_tags=p.reasoning_tags,
                        model_format=p.model_format,
                    )
                for delta in _chat_deltas(gen, out, ev, logprobs, timings):
                    yield delta
                if ev.finish_reason is not None:
                    reason = out.finish_reason(ev.finish_reason)
            if reason is not None:
                if ev.usage is not None:
                    finals[i] = ev.usage
                yield Finish(
                    i, reason, ev.usage or _NO_USAGE, ev.timings, ev.stop_type, ev.stopping_word, ev.id_slot
                )
        yield Done(merged_usage(finals, job.n))
    except CorralError as exc:
        yield Failed(exc)


def _chat_deltas(
    gen: Generation, out: ChatOutput, ev: TokenEvent, logprobs: tuple[TokenLogprob, ...], timings: Timings | None
) -> list[Delta]:
    """One step of a chat choice through its parser; its timings ride on every delta it
    makes. Logprobs leave with the text they are for, on the first delta that carries it:
    while the parser holds text back (what may open a tool call), its tokens' logprobs
    wait with it, and when max_tokens cuts the call short they are dropped with it. So a
    client's logprobs cover exactly the tokens whose text or call it received (docs/api.md)."""
    was_ended = out.ended
    deltas = out.feed(ev.text) if ev.text else []
    if out.ended and not was_ended and ev.finish_reason is None:
        gen.end_choice(ev.index)  # its final event follows, "cancelled"
    if ev.finish_reason is not None:
        deltas += out.finish(cut=_cut(ev.finish_reason))
    pending = out.held_logprobs + logprobs if out.held_logprobs else logprobs
    out.held_logprobs = ()
    if not deltas:
        if ev.finish_reason is None:
            out.held_logprobs = pending
        return []
    if ev.finish_reason is not None and _cut(ev.finish_reason):
        pending = _covering(pending, deltas)
    if timings is not None:
        deltas = [_with(d, timings=timings) for d in deltas]
    if pending:
        deltas[0] = _with(deltas[0], logprobs=pending)
    return deltas


def _covering(held: tuple[TokenLogprob, ...], deltas: list[Delta]) -> tuple[TokenLogprob, ...]:
    """The first of `held` whose bytes the text of `deltas` covers, when a cut dropped the
    rest of the held text (a call being written); all of them where a call was made."""
    if any(isinstance(d, ToolCallStart) for d in deltas):
        return held
    room = sum(len(d.text.encode()) for d in deltas if isinstance(d, (TextDelta, ReasoningDelta)))
    kept = 0
    for lp in held:
        room -= len(lp.piece)
        if room < 0:
            break
        kept += 1
    return held[:kept]


def _with(delta: Delta, **changes: object) -> Delta:
    """`delta` with `changes` applied to the fields it has (a ToolCallEnd has no timings,
    a ToolCallDelta no logprobs)."""
    cls = type(delta)
    names = _FIELDS.get(cls)
    if names is None:  # read once per event type: this runs per step of such a stream
        names = _FIELDS[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    kept: dict[str, Any] = {k: v for k, v in changes.items() if k in names}
    return dataclasses.replace(delta, **kept)


_FIELDS: dict[type, frozenset[str]] = {}
