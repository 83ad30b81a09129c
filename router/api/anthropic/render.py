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
from router.generation.answer import arguments
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


def sse(kind: str, data: dict[str, object]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _json.encode({"type": kind, **data}) + b"\n\n"


class _Message:
    """A message built from the events, block by block, as its stream shows it: `feed`
    returns an event's server-sent events, and `content` is what they add up to, so that
    a whole message and a streamed one cannot differ."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.content: list[dict[str, object]] = []
        self.open: str | None = None  # the type of the block being streamed
        self.held = ""  # whitespace that opens no text block unless more text follows
        self.arguments = ""  # the open tool_use block's input, as JSON text
        self.finish: Finish | None = None

    @property
    def index(self) -> int:
        return len(self.content) - 1

    def start(self, block: dict[str, object]) -> list[bytes]:
        out = self.stop()
        self.content.append(dict(block))
        self.open, self.arguments = str(block["type"]), ""
        return out + [sse("content_block_start", {"index": self.index, "content_block": block})]

    def delta(self, field: str, text: str, delta: dict[str, object]) -> bytes:
        block = self.content[-1]
        block[field] = str(block[field]) + text
        return sse("content_block_delta", {"index": self.index, "delta": delta})

    def stop(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":  # Anthropic's thinking block ends with its signature
            out.append(sse("content_block_delta", {"index": self.index, "delta": {"type": "signature_delta", "signature": ""}}))
        elif self.open == "tool_use":
            self.content[-1]["input"] = arguments(self.arguments or "{}")
        self.open = None
        return out + [sse("content_block_stop", {"index": self.index})]

    def feed(self, ev: Event) -> list[bytes]:
        if isinstance(ev, Begin):
            return [sse("message_start", {"message": self.reply.message([], None, ev.usage)}), sse("ping", {})]
        if isinstance(ev, ReasoningDelta) and ev.text:
            out = [] if self.open == "thinking" else self.start({"type": "thinking", "thinking": "", "signature": ""})
            return out + [self.delta("thinking", ev.text, {"type": "thinking_delta", "thinking": ev.text})]
        if isinstance(ev, TextDelta) and ev.text:
            text, out = ev.text, []
            if self.open != "text":
                self.held += text
                if not self.held.strip():
                    return []
                text, self.held = self.held, ""
                out = self.start({"type": "text", "text": ""})
            return out + [self.delta("text", text, {"type": "text_delta", "text": text})]
        if isinstance(ev, ToolCallStart):
            self.held = ""
            return self.start({"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}})
        if isinstance(ev, ToolCallDelta) and ev.arguments:
            self.arguments += ev.arguments
            return [sse("content_block_delta", {"index": self.index, "delta": {"type": "input_json_delta", "partial_json": ev.arguments}})]
        if isinstance(ev, ToolCallEnd):
            return self.stop()
        if isinstance(ev, Finish):
            self.finish = ev
            reason, sequence = self.reply.stop(ev)
            delta = {"stop_reason": reason, "stop_sequence": sequence}
            return self.stop() + [sse("message_delta", {"delta": delta, "usage": usage_json(ev.usage)})]
        if isinstance(ev, Done):
            return [sse("message_stop", {})]
        if isinstance(ev, Failed):
            return [error_event(ev.error)]
        return []


async def whole(events: AsyncIterator[Event], reply: Reply) -> bytes:
    """The body of a message that does not stream; a failure raises."""
    m = _Message(reply)
    usage: Usage | None = None
    async for ev in events:
        if isinstance(ev, Failed):
            raise ev.error
        if isinstance(ev, Done):
            usage = ev.usage
        m.feed(ev)
    return _json.encode(reply.message(m.content, m.finish, usage))


async def stream(events: AsyncIterator[Event], reply: Reply) -> AsyncIterator[bytes]:
    m = _Message(reply)
    async for ev in events:
        for chunk in m.feed(ev):
            yield chunk
