"""An Anthropic Messages stream read back into the internal events.

The upstream streams `message_start` (the prompt's usage), then content blocks, each a
`content_block_start`, its deltas and a `content_block_stop`, then `message_delta` (the
stop reason and the output's usage) and `message_stop`. Text blocks become `TextDelta`s,
thinking blocks `ReasoningDelta`s, and a `tool_use` block one whole call (start, its
arguments, end) when the block stops, its `partial_json` pieces joined: input that is not a
JSON object fails the answer, unless max_tokens cut it short (a "length" finish). A delta
for a block that is not open fails it too. Blocks of a kind
the internal events have no place for (a server tool's, a redacted thinking block) are
passed over. `ping` is nothing.

A stream that ends without `message_stop` and a stop reason was cut: it ends in `Failed`,
never as if the answer were whole; so does an `error` event (an overloaded_error as the
503 that HTTP 529 is, a rate_limit_error as a 429).

Pure: JSON in, events out, tested without an upstream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from router.generation.calls import arguments_whole
from router.generation.events import (
    Begin, Done, Event, Finish, Reason, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart,
)
from router.generation.remote.inbound import as_object, broken, count_of, error_event, event_object
from worker.protocol import StopType, Usage

# Anthropic's stop reasons as the internal ones, with llama-server's stop type. A refusal
# is the model's own end of its turn; pause_turn (a server tool's pause) ends this answer.
_REASONS: dict[str, tuple[Reason, StopType]] = {
    "end_turn": ("stop", "eos"), "stop_sequence": ("stop", "word"), "max_tokens": ("length", "limit"),
    "model_context_window_exceeded": ("length", "limit"), "tool_use": ("tool_calls", "eos"),
    "refusal": ("stop", "eos"), "pause_turn": ("stop", "eos"),
}


@dataclass
class _Block:
    kind: str
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    given: Any = None  # a tool_use block's `input` as it started


class MessageReader:
    """Reads one Messages stream; `feed` takes each event's data, `end` the stream's end."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._begun = False
        self._blocks: dict[int, _Block] = {}
        self._calls = 0
        self._cut: list[tuple[_Block, str]] = []  # tool_use blocks whose input is not a JSON object
        self._prompt = self._cached = self._output = 0
        self._pieces = 0  # deltas that carried output, for an answer whose usage never comes
        self._reason: str | None = None
        self._word = ""
        self.done = False  # message_stop came
        self.failed = False

    def feed(self, data: str) -> list[Event]:
        if self.done or self.failed:
            return []
        obj = event_object(data)
        if isinstance(obj, str):
            return self._fail(obj)
        kind = obj.get("type")
        if kind == "error":
            self.failed = True
            return [error_event(self._model, obj)]
        out: list[Event] = []
        if not self._begun and kind in ("message_start", "content_block_start", "content_block_delta"):
            self._begun = True
            if kind == "message_start":
                self._usage(as_object(as_object(obj.get("message")).get("usage")))
            out.append(Begin(0, Usage(prompt_tokens=self._prompt, completion_tokens=0, cached_tokens=self._cached)))
        if kind == "content_block_start":
            out += self._start(obj)
        elif kind == "content_block_delta":
            self._pieces += 1
            out += self._delta(obj)
        elif kind == "content_block_stop":
            out += self._stop(obj)
        elif kind == "message_delta":
            delta = as_object(obj.get("delta"))
            if isinstance(delta.get("stop_reason"), str):
                self._reason = delta["stop_reason"]
                self._word = delta["stop_sequence"] if isinstance(delta.get("stop_sequence"), str) else ""
            self._usage(as_object(obj.get("usage")))
        elif kind == "message_stop":
            self.done = True
        return out

    def _usage(self, u: dict[str, Any]) -> None:
        """Anthropic's counts, cumulative where they come again: its input_tokens leave out
        the prompt's cached part, which OpenAI's prompt_tokens include."""
        if "input_tokens" in u or "cache_read_input_tokens" in u:
            cached = count_of(u.get("cache_read_input_tokens"))
            self._prompt = count_of(u.get("input_tokens")) + cached + count_of(u.get("cache_creation_input_tokens"))
            self._cached = cached
        if "output_tokens" in u:
            self._output = count_of(u.get("output_tokens"))

    def _start(self, obj: dict[str, Any]) -> list[Event]:
        block = as_object(obj.get("content_block"))
        index = obj.get("index")
        if not isinstance(index, int):
            return []
        b = self._blocks[index] = _Block(str(block.get("type")))
        if b.kind == "tool_use":
            b.id = block["id"] if isinstance(block.get("id"), str) else f"toolu_{index}"
            b.name = block["name"] if isinstance(block.get("name"), str) else ""
            b.given = block.get("input")
        elif b.kind == "text" and isinstance(block.get("text"), str) and block["text"]:
            return [TextDelta(0, block["text"])]  # a block may start with text of its own
        return []

    def _delta(self, obj: dict[str, Any]) -> list[Event]:
        d = as_object(obj.get("delta"))
        kind = d.get("type")
        b = self._blocks.get(obj["index"]) if isinstance(obj.get("index"), int) else None
        if b is None:  # a piece of no block: where it belongs is unknown, so the answer is
            return self._fail(f"sent a delta for content block {obj.get('index')!r}, which is not open")
        if kind == "text_delta" and isinstance(d.get("text"), str) and d["text"]:
            return [TextDelta(0, d["text"])]
        if kind == "thinking_delta" and isinstance(d.get("thinking"), str) and d["thinking"]:
            return [ReasoningDelta(0, d["thinking"])]
        if kind == "input_json_delta" and b.kind == "tool_use" and isinstance(d.get("partial_json"), str):
            b.arguments.append(d["partial_json"])
        return []  # signature_delta, citations_delta: nothing the internal events carry

    def _stop(self, obj: dict[str, Any]) -> list[Event]:
        b = self._blocks.pop(obj["index"], None) if isinstance(obj.get("index"), int) else None
        if b is None or b.kind != "tool_use":
            return []
        arguments = "".join(b.arguments) or (json.dumps(b.given) if isinstance(b.given, dict) else "{}")
        if not arguments_whole(arguments):  # whole only if max_tokens cut it: known at the end
            self._cut.append((b, arguments))
            return []
        return self._call(b, arguments)

    def _call(self, b: _Block, arguments: str) -> list[Event]:
        n, self._calls = self._calls, self._calls + 1
        return [ToolCallStart(0, n, b.id, b.name), ToolCallDelta(0, n, arguments), ToolCallEnd(0, n)]

    def so_far(self) -> Usage:
        """The usage of an answer that ends before its end (its client gone): the prompt's
        from message_start, and at least a token per delta that carried output."""
        return Usage(prompt_tokens=self._prompt, completion_tokens=max(self._output, self._pieces),
                     cached_tokens=self._cached)

    def end(self) -> list[Event]:
        """The events that end the answer: its Finish and Done, or Failed when the stream
        did not end as a whole answer does."""
        if self.failed:
            return []
        if not self._begun:
            return self._fail("ended its answer before it began")
        if not self.done or self._reason is None or self._blocks:
            return self._fail("ended its answer before it was complete")
        reason, stop_type = _REASONS.get(self._reason, ("stop", "eos"))
        if self._cut and reason != "length":
            return self._fail(f"sent a tool call whose input is not a JSON object: {self._cut[0][1][:80]!r}")
        out = [ev for b, arguments in self._cut for ev in self._call(b, arguments)]  # cut short by max_tokens
        if self._calls and reason == "stop":
            reason = "tool_calls"
        usage = Usage(prompt_tokens=self._prompt, completion_tokens=self._output, cached_tokens=self._cached)
        return [*out, Finish(0, reason, usage, stop_type=stop_type, stopping_word=self._word), Done(usage)]

    def _fail(self, what: str) -> list[Event]:
        self.failed = True
        return [broken(self._model, what)]
