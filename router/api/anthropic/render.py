"""The internal event stream rendered in Anthropic's shapes: a whole `message`, or its
server-sent events.

A message's content is blocks: `thinking` (with an empty `signature`: a local model's
reasoning is signed by no one), `text` and `tool_use` (its `input` an object). A stream
is Anthropic's sequence, each event named in its `event:` line:

    message_start, ping,
    (content_block_start, content_block_delta*, content_block_stop)*,
    message_delta, message_stop

with `thinking_delta`, `text_delta` and `input_json_delta` deltas, blocks numbered from 0 in
the order the model wrote them. Text that is only whitespace opens no block (Anthropic
refuses such a block when a client sends the conversation back), so the blank line a model
writes before its call is dropped. A failure after the headers is an `error` event, and no
message_stop follows.

`usage` is Anthropic's: `input_tokens` are the prompt's tokens not read from the prefix
cache, `cache_read_input_tokens` those that were.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import AsyncIterator

import msgspec

from router.api.anthropic.errors import error_event
from router.generation.answer import ChoiceAnswer, arguments, gather
from router.generation.events import (
    Begin, Done, Event, Failed, Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart,
)
from worker.protocol import Usage

_json = msgspec.json.Encoder()


def usage_json(u: Usage | None) -> dict[str, int]:
    u = u or Usage(prompt_tokens=0, completion_tokens=0)
    return {
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
    }


@dataclass
class Reply:
    """One message being built: its id, model, and the stop sequences the request named
    (a stop string of the model's own config is an end_turn, not the client's sequence)."""

    model: str
    stop_sequences: tuple[str, ...] = ()
    id: str = field(default_factory=lambda: "msg_" + secrets.token_hex(12))

    def stop(self, f: Finish | None) -> tuple[str, str | None]:
        """stop_reason and stop_sequence."""
        if f is None:
            return "end_turn", None
        if f.reason == "tool_calls":
            return "tool_use", None
        if f.reason == "length":
            return "max_tokens", None
        if f.stop_type == "word" and f.stopping_word in self.stop_sequences:
            return "stop_sequence", f.stopping_word
        return "end_turn", None

    def message(self, content: list[dict[str, object]], f: Finish | None, usage: Usage | None) -> dict[str, object]:
        reason, sequence = self.stop(f) if f is not None else (None, None)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage_json(usage),
        }


def content_blocks(c: ChoiceAnswer) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    if c.reasoning:
        out.append({"type": "thinking", "thinking": c.reasoning, "signature": ""})
    if c.content.strip() or (c.content and not c.calls):
        out.append({"type": "text", "text": c.content})
    for call in c.calls:
        out.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments(call.arguments)})
    return out


async def whole(events: AsyncIterator[Event], reply: Reply) -> bytes:
    """The body of a message that does not stream; a failure raises."""
    answer = await gather(events)
    c = answer.by_index[0]
    return _json.encode(reply.message(content_blocks(c), c.finish, answer.usage))


def sse(kind: str, data: dict[str, object]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _json.encode({"type": kind, **data}) + b"\n\n"


class _Blocks:
    """The stream's content blocks: which is open, and its index."""

    def __init__(self) -> None:
        self.open: str | None = None
        self.index = -1

    def start(self, block: dict[str, object]) -> list[bytes]:
        out = self.stop()
        self.index += 1
        self.open = str(block["type"])
        return out + [sse("content_block_start", {"index": self.index, "content_block": block})]

    def delta(self, delta: dict[str, object]) -> bytes:
        return sse("content_block_delta", {"index": self.index, "delta": delta})

    def stop(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [sse("content_block_stop", {"index": self.index})]


async def stream(events: AsyncIterator[Event], reply: Reply) -> AsyncIterator[bytes]:
    blocks = _Blocks()
    held = ""  # whitespace that opens no text block unless more text follows
    async for ev in events:
        if isinstance(ev, Begin):
            yield sse("message_start", {"message": reply.message([], None, ev.usage)})
            yield sse("ping", {})
        elif isinstance(ev, ReasoningDelta) and ev.text:
            if blocks.open != "thinking":
                for b in blocks.start({"type": "thinking", "thinking": "", "signature": ""}):
                    yield b
            yield blocks.delta({"type": "thinking_delta", "thinking": ev.text})
        elif isinstance(ev, TextDelta) and ev.text:
            text = ev.text
            if blocks.open != "text":
                held += text
                if not held.strip():
                    continue
                text, held = held, ""
                for b in blocks.start({"type": "text", "text": ""}):
                    yield b
            yield blocks.delta({"type": "text_delta", "text": text})
        elif isinstance(ev, ToolCallStart):
            held = ""
            for b in blocks.start({"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}}):
                yield b
        elif isinstance(ev, ToolCallDelta) and ev.arguments:
            yield blocks.delta({"type": "input_json_delta", "partial_json": ev.arguments})
        elif isinstance(ev, ToolCallEnd):
            for b in blocks.stop():
                yield b
        elif isinstance(ev, Finish):
            for b in blocks.stop():
                yield b
            reason, sequence = reply.stop(ev)
            delta = {"stop_reason": reason, "stop_sequence": sequence}
            yield sse("message_delta", {"delta": delta, "usage": usage_json(ev.usage)})
        elif isinstance(ev, Done):
            yield sse("message_stop", {})
        elif isinstance(ev, Failed):
            yield error_event(ev.error)
