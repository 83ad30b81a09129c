"""The internal event stream rendered in Ollama's shapes: /api/chat's `message` and
/api/generate's `response`, whole or as NDJSON lines (one JSON object a line, as Ollama's
clients read them), each with `done`, and the last with `done_reason` and the counts and
durations (in nanoseconds) Ollama reports.

A tool call comes whole in one line (Ollama streams calls so), its arguments an object.
A failure after the headers is a last `{"error": ...}` line, which Ollama's clients raise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, AsyncIterator

import msgspec

from router.generation.answer import Call, arguments, gather
from router.generation.events import (
    Event, Failed, Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart,
)
from router.api.ollama.errors import message
from router.server.access_log import Record

HEADERS = {
    "content-type": "application/x-ndjson",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",  # nginx: pass lines through as they come
}
_json = msgspec.json.Encoder()


def created_at() -> str:
    """Now, as Ollama writes it (RFC 3339 in UTC)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def line(obj: object) -> bytes:
    return _json.encode(obj) + b"\n"


def call_json(index: int, call: Call) -> dict[str, Any]:
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": arguments(call.arguments)}}


@dataclass
class Reply:
    """One answer being built: /api/chat's (`message`) or /api/generate's (`response`)."""

    model: str
    chat: bool
    record: Record | None = None  # the access log's, for the load's duration
    started: float = field(default_factory=time.monotonic)

    def part(self, text: str = "", thinking: str = "", calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        obj: dict[str, Any] = {"model": self.model, "created_at": created_at()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            obj["message"] = message
        else:
            obj["response"] = text
            if thinking:
                obj["thinking"] = thinking
        obj["done"] = False
        return obj

    def final(self, obj: dict[str, Any], finish: Finish) -> dict[str, Any]:
        """`obj` (a part) as the answer's last: done, why, the counts and the durations."""
        t, u = finish.timings, finish.usage
        load = self.record.load_wait if self.record is not None else None
        obj.update(
            done=True,
            done_reason="length" if finish.reason == "length" else "stop",
            total_duration=int((time.monotonic() - self.started) * 1e9),
            load_duration=int((load or 0.0) * 1e9),
            prompt_eval_count=u.prompt_tokens,
            prompt_eval_duration=int(t.prompt_ms * 1e6) if t is not None else 0,
            eval_count=u.completion_tokens,
            eval_duration=int(t.predicted_ms * 1e6) if t is not None else 0,
        )
        return obj


async def whole(events: AsyncIterator[Event], reply: Reply) -> bytes:
    answer = await gather(events)
    c = answer.by_index[0]
    assert c.finish is not None
    calls = [call_json(i, call) for i, call in enumerate(c.calls)]
    return _json.encode(reply.final(reply.part(c.text, c.reasoning, calls), c.finish))


async def lines(events: AsyncIterator[Event], reply: Reply) -> AsyncIterator[bytes]:
    calls: dict[int, Call] = {}
    async for ev in events:
        if isinstance(ev, TextDelta) and (ev.text or ev.echo):
            yield line(reply.part(ev.echo + ev.text))
        elif isinstance(ev, ReasoningDelta) and ev.text:
            yield line(reply.part(thinking=ev.text))
        elif isinstance(ev, ToolCallStart):
            calls[ev.call] = Call(ev.id, ev.name)
        elif isinstance(ev, ToolCallDelta):
            calls[ev.call].arguments += ev.arguments
        elif isinstance(ev, ToolCallEnd):
            yield line(reply.part(calls=[call_json(ev.call, calls[ev.call])]))
        elif isinstance(ev, Finish):
            yield line(reply.final(reply.part(), ev))
        elif isinstance(ev, Failed):
            yield line({"error": message(ev.error)})
