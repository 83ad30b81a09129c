"""The internal event stream rendered in OpenAI's Responses shapes: a whole `response`
object, or its server-sent events, each named in its `event:` line and numbered by
`sequence_number` from 0.

Output items come in the order the model wrote them: `reasoning` (its text as a
`reasoning_text` part), `message` (one `output_text` part) and `function_call` (its
`call_id` the call's id). A stream opens each item (`output_item.added`, and its part),
streams it (`reasoning_text.delta`, `output_text.delta`, `function_call_arguments.delta`),
and finishes it (the `.done` events, `output_item.done`) before the next opens. Text that
is only whitespace opens no message (the blank a model writes before its call).

The response ends `completed`; `incomplete` with `incomplete_details.reason`
"max_output_tokens" when the token limit cut it (OpenAI's reference; llama-server says
completed, which hides the cut); `failed` with its `error` when it broke after it began.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import msgspec

from router.generation.calls import arguments_whole
from router.generation.events import (
    Begin, Done, Event, Failed, Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart,
)
from supervisor.errors import CorralError, Overloaded
from worker.protocol import ChatMessage, ToolCall, Usage

_json = msgspec.json.Encoder()


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


def usage_json(u: Usage | None) -> dict[str, Any] | None:
    if u is None:
        return None
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        # Reasoning is not counted apart from the answer: its tokens are in output_tokens.
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }


# What the response keeps when it is done: its object, and its output as the assistant's turn.
Keep = Callable[[dict[str, Any], ChatMessage], None]


@dataclass
class Reply:
    """One response being built. `echo` holds the request's settings that every response
    object repeats (instructions, tools, tool_choice, temperature, ...)."""

    model: str
    echo: dict[str, Any]
    keep: Keep | None = None
    namespaces: dict[str, str] = field(default_factory=dict)  # a namespaced function's namespace
    id: str = field(default_factory=lambda: new_id("resp_"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(
        self, status: str, output: list[dict[str, Any]], usage: Usage | None = None,
        error: dict[str, Any] | None = None, incomplete: str | None = None,
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "model": self.model,
            "output": output,
            **self.echo,
            "usage": usage_json(usage),
        }

    def finished(self, output: list[dict[str, Any]], f: Finish | None, usage: Usage | None) -> dict[str, Any]:
        """The final object, kept when the request stores it."""
        cut = f is not None and f.reason == "length"
        obj = self.response("incomplete" if cut else "completed", output, usage, incomplete="max_output_tokens" if cut else None)
        if self.keep is not None:
            self.keep(obj, assistant_turn(output))
        return obj


def assistant_turn(output: list[dict[str, Any]]) -> ChatMessage:
    """A response's output as the assistant's message of the conversation it continues."""
    text, reasoning, calls = [], [], []
    for item in output:
        if item["type"] == "message":
            text += [p["text"] for p in item["content"]]
        elif item["type"] == "reasoning":
            reasoning += [p["text"] for p in item["content"]]
        elif item["type"] == "function_call":
            calls.append(ToolCall(id=item["call_id"], name=item["name"], arguments=item["arguments"]))
    return ChatMessage(
        role="assistant", content="".join(text), tool_calls=calls or None,
        reasoning_content="".join(reasoning) if reasoning else None,
    )


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": new_id("msg_"), "type": "message", "role": "assistant", "status": status, "content": [_text_part(text)]}


def _reasoning(text: str) -> dict[str, Any]:
    return {
        "id": new_id("rs_"), "type": "reasoning", "status": "completed", "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def _call(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"id": new_id("fc_"), "type": "function_call", "status": status, "call_id": call_id, "name": name, "arguments": arguments}


def failure(exc: CorralError) -> dict[str, Any]:
    """A failed response's `error`: its code is one of the few the Responses API lists
    (the SDK refuses any other), the message says what broke."""
    code = "rate_limit_exceeded" if isinstance(exc, Overloaded) else "server_error"
    return {"code": code, "message": exc.message}


class _Events:
    """The stream's events, numbered, and its output items as they are made: `feed`
    returns an event's server-sent events, and `output` is what they add up to, so that a
    whole response and a streamed one cannot differ."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.text = ""  # its text (or arguments) so far
        self.held = ""  # whitespace that opens no message unless more text follows
        self.finish: Finish | None = None
        self.final: dict[str, Any] | None = None  # the response, once done

    def sse(self, kind: str, **data: Any) -> bytes:
        body = _json.encode({"type": kind, "sequence_number": self.seq, **data})
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"

    def _at(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.output) - 1}

    def start(self, item: dict[str, Any], part: dict[str, Any] | None) -> list[bytes]:
        out = self.stop()
        self.output.append(item)
        self.open, self.text = item, ""
        out.append(self.sse("response.output_item.added", output_index=len(self.output) - 1, item=item))
        if part is not None:
            out.append(self.sse("response.content_part.added", **self._at(), content_index=0, part=part))
        return out

    def delta(self, text: str) -> bytes:
        assert self.open is not None
        self.text += text
        kind = self.open["type"]
        if kind == "function_call":
            return self.sse("response.function_call_arguments.delta", **self._at(), delta=text)
        if kind == "reasoning":
            return self.sse("response.reasoning_text.delta", **self._at(), content_index=0, delta=text)
        return self.sse("response.output_text.delta", **self._at(), content_index=0, delta=text, logprobs=[])

    def stop(self, status: str = "completed") -> list[bytes]:
        item = self.open
        if item is None:
            return []
        at, out = self._at(), []
        if item["type"] == "function_call":
            # Arguments that are not whole (max_output_tokens cut the call) are not a
            # completed call, whatever ends the response after it.
            done = item | {"status": status if arguments_whole(self.text) else "incomplete", "arguments": self.text}
            out.append(self.sse("response.function_call_arguments.done", **at, name=item["name"], arguments=self.text))
        elif item["type"] == "reasoning":
            done = _reasoning(self.text) | {"id": item["id"]}
            part = done["content"][0]
            out.append(self.sse("response.reasoning_text.done", **at, content_index=0, text=self.text))
            out.append(self.sse("response.content_part.done", **at, content_index=0, part=part))
        else:
            done = _message(self.text, status) | {"id": item["id"]}
            out.append(self.sse("response.output_text.done", **at, content_index=0, text=self.text, logprobs=[]))
            out.append(self.sse("response.content_part.done", **at, content_index=0, part=done["content"][0]))
        self.output[-1] = done
        self.open = None
        out.append(self.sse("response.output_item.done", output_index=at["output_index"], item=done))
        return out


    def feed(self, ev: Event) -> list[bytes]:
        out: list[bytes] = []
        if isinstance(ev, Begin):
            started = self.reply.response("in_progress", [])
            out += [self.sse("response.created", response=started), self.sse("response.in_progress", response=started)]
        elif isinstance(ev, ReasoningDelta) and ev.text:
            if self.open is None or self.open["type"] != "reasoning":
                item = {"id": new_id("rs_"), "type": "reasoning", "status": "in_progress", "summary": [], "content": []}
                out += self.start(item, {"type": "reasoning_text", "text": ""})
            out.append(self.delta(ev.text))
        elif isinstance(ev, TextDelta) and ev.text:
            text = ev.text
            if self.open is None or self.open["type"] != "message":
                self.held += text
                if not self.held.strip():
                    return []
                text, self.held = self.held, ""
                item = {"id": new_id("msg_"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
                out += self.start(item, _text_part(""))
            out.append(self.delta(text))
        elif isinstance(ev, ToolCallStart):
            self.held = ""
            item = _call(ev.id, ev.name, "", "in_progress")
            if ev.name in self.reply.namespaces:  # the call names its function as declared
                item["namespace"] = self.reply.namespaces[ev.name]
            out += self.start(item, None)
        elif isinstance(ev, ToolCallDelta) and ev.arguments:
            out.append(self.delta(ev.arguments))
        elif isinstance(ev, ToolCallEnd):
            out += self.stop()
        elif isinstance(ev, Finish):
            self.finish = ev
            out += self.stop("incomplete" if ev.reason == "length" else "completed")
        elif isinstance(ev, Done):
            final = self.reply.finished(self.output, self.finish, ev.usage)
            out.append(self.sse(f"response.{final['status']}", response=final))
            self.final = final
        elif isinstance(ev, Failed):
            out += self.stop("incomplete")
            failed = self.reply.response("failed", self.output, error=failure(ev.error))
            out.append(self.sse("response.failed", response=failed))
        return out


async def whole(events: AsyncIterator[Event], reply: Reply) -> bytes:
    """The body of a response that does not stream, built as its stream would be; a
    failure raises."""
    s = _Events(reply)
    async for ev in events:
        if isinstance(ev, Failed):
            raise ev.error
        s.feed(ev)
    assert s.final is not None
    return _json.encode(s.final)


async def stream(events: AsyncIterator[Event], reply: Reply) -> AsyncIterator[bytes]:
    s = _Events(reply)
    async for ev in events:
        for chunk in s.feed(ev):
            yield chunk
