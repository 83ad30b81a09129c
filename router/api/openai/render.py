"""The internal event stream (router/generation/events.py) rendered in OpenAI's shapes:
a whole chat or text completion, or its SSE chunks.

A streamed choice's first chunk carries the role (chat), its last the finish_reason; a
chat's reasoning and tool calls arrive as `reasoning_content` and `tool_calls` deltas. A
failure after the headers is a final error event, and the stream then ends without
[DONE], so that a client cannot take a cut answer for a whole one.
"""

from __future__ import annotations

from typing import AsyncIterator

from router.api.openai.errors import error_event
from router.api.openai.logprobs import chat_logprobs, completion_logprobs
from router.api.openai.shapes import DONE, Completion
from router.generation.answer import gather
from router.generation.events import (
    Begin, Done, Event, Failed, Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart,
)
from router.generation.job import GenerationJob
from worker.protocol import Timings


async def whole(events: AsyncIterator[Event], fmt: Completion, job: GenerationJob) -> bytes:
    """The body of a non-streamed response of n choices per prompt; a failure raises."""
    answer = await gather(events)
    return fmt.whole(answer.ordered(), answer.usage, job.logprobs, answer.timings if job.timings else None)


async def chunks(events: AsyncIterator[Event], fmt: Completion, job: GenerationJob) -> AsyncIterator[bytes]:
    """The SSE events of a streamed response."""
    offsets: dict[int, int] = {}  # completions: each choice's characters so far
    timings: Timings | None = None  # the last choice's, for the usage chunk
    async for ev in events:
        if isinstance(ev, Begin):
            if fmt.chat:
                yield fmt.chunk("", first=True, index=ev.choice)
        elif isinstance(ev, TextDelta) and not fmt.chat:
            text = ev.echo + ev.text
            lp: dict[str, object] | None = None
            if ev.logprobs:  # this event's tokens start after the echoed prompt, if it is here
                lp, _ = completion_logprobs(ev.logprobs, offsets.get(ev.choice, 0) + len(ev.echo))
            offsets[ev.choice] = offsets.get(ev.choice, 0) + len(text)
            if text or lp is not None:
                yield fmt.chunk(text, index=ev.choice, logprobs=lp, timings=ev.timings)
        elif isinstance(ev, (TextDelta, ReasoningDelta, ToolCallStart, ToolCallDelta)):
            delta: dict[str, object]
            if isinstance(ev, TextDelta):
                delta = {"content": ev.text} if ev.text else {}
            elif isinstance(ev, ReasoningDelta):
                delta = {"reasoning_content": ev.text}
            elif isinstance(ev, ToolCallStart):
                # OpenAI's streaming shape: the id, type and name first, then the arguments.
                call = {"index": ev.call, "id": ev.id, "type": "function", "function": {"name": ev.name, "arguments": ""}}
                delta = {"tool_calls": [call]}
            else:
                delta = {"tool_calls": [{"index": ev.call, "function": {"arguments": ev.arguments}}]}
            logprobs = getattr(ev, "logprobs", ())
            lp = chat_logprobs(logprobs) if logprobs else None
            if delta or lp is not None:
                yield fmt.delta_chunk(delta, index=ev.choice, logprobs=lp, timings=ev.timings)
        elif isinstance(ev, Finish):
            timings = ev.timings or timings
            yield fmt.chunk(None, ev.reason, index=ev.choice, timings=ev.timings if job.timings else None)
        elif isinstance(ev, Done):
            if job.include_usage:
                yield fmt.usage_chunk(ev.usage, timings)
            yield DONE
        elif isinstance(ev, Failed):
            yield error_event(ev.error)
