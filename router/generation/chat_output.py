"""A chat reply's text stream turned into its parts: content, reasoning and tool calls, as
the internal stream's deltas (router/generation/events.py) and as the whole reply.

Reasoning is split off first (router/generation/reasoning.py), and tool calls are looked for only in
what remains (router/generation/tool_calls.py), so a call the model merely thinks about is not made.

Two rules on the calls found (issue 20):
- a call to a function the request did not declare is no call: its text is content, since
  a client cannot dispatch it;
- a call exactly like an earlier one of the same reply (same function, same arguments) is
  a model repeating itself, not a parallel call: it and all that follows are dropped, and
  the reply `ended`, so that the router can stop its generation. The demo model, forced to
  call with parallel calls allowed, wrote the same two calls in turn until max_tokens.
Pure: the router feeds it the worker's text.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Collection

from router.generation.events import Delta, Reason, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart
from router.generation.functionary import FunctionaryParser
from router.generation.harmony import HarmonyParser
from router.generation.muse import MuseParser
from router.generation.reasoning import MarkerStripper, ReasoningSplitter
from router.generation.calls import Call
from router.generation.tagged_calls import ParamTypes
from router.generation.tool_calls import ToolCallParser
from router.server import json_text
from worker.chat_formats import CONTENT_WRAPPERS, call_opening
from worker.protocol import FinishReason, TokenLogprob, ToolFormat

_ALNUM = string.ascii_letters + string.digits


@dataclass(frozen=True)
class MadeCall:
    index: int
    id: str
    name: str
    arguments: str


def call_id(fmt: ToolFormat | None, own: str | None, name: str = "", index: int = 0) -> str:
    """An id for a call. Mistral's templates refuse any id but 9 letters and digits, which
    is what its models write, so a Mistral-format model keeps or gets one of those. Kimi
    K2's template writes a call's id where its name goes (`functions.NAME:INDEX`, as its
    models write it), so a Kimi call keeps or gets one of those; everyone else gets
    OpenAI's "call_" ids."""
    if fmt == "mistral":
        if own is not None and len(own) == 9 and own.isalnum():
            return own
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    if fmt == "kimi_k2":
        return own if own is not None and own.startswith(f"functions.{name}:") else f"functions.{name}:{index}"
    return "call_" + secrets.token_hex(12)


@dataclass
class ChatOutput:
    """Feed the worker's text for choice `choice`; get its deltas back. The whole reply
    accumulates in `content`, `reasoning_text` and `calls`."""

    tools: ToolFormat | None  # None: no tools were offered; all text is content
    reasoning: bool  # split <think> blocks off
    in_reasoning: bool = False  # the prompt ended inside an open block
    choice: int = 0
    # The functions the request declared (None: any name is taken as a call).
    declared: Collection[str] | None = None
    param_types: ParamTypes | None = None  # router/generation/tool_blocks.py
    content: str = ""
    reasoning_text: str = ""
    calls: list[MadeCall] = field(default_factory=list)
    ended: bool = False  # a call repeated an earlier one: nothing more is taken
    # GPT-OSS: the output is harmony messages (router/generation/harmony.py), tools or not.
    harmony: bool = False
    reasoning_tags: tuple[str, str] = ("<think>", "</think>")  # the family's block
    # The model's format, tools or not: what wraps its content (worker/chat_formats.py).
    model_format: ToolFormat | None = None
    # Logprobs of the tokens whose text is held back, until it goes out (stream.py).
    held_logprobs: tuple[TokenLogprob, ...] = ()

    def __post_init__(self) -> None:
        # Formats whose whole output is messages, tools or not.
        fmt = self.model_format or self.tools
        self._harmony: HarmonyParser | FunctionaryParser | MuseParser | None = (
            HarmonyParser() if self.harmony
            else FunctionaryParser() if fmt == "functionary_v3_2"
            else MuseParser(self.param_types) if fmt == "muse_glimmer"
            else None
        )
        opening = call_opening(self.tools)
        markers = (opening,) if opening else ()
        self._splitter = ReasoningSplitter(self.in_reasoning, markers, self.reasoning_tags) if self.reasoning else None
        self._parser = ToolCallParser(self.tools, self.param_types) if self.tools is not None else None
        self._seen: set[tuple[str, str]] = set()
        wrappers = CONTENT_WRAPPERS.get(self.model_format or self.tools or "")
        self._unwrap = MarkerStripper(wrappers) if wrappers else None

    def feed(self, text: str) -> list[Delta]:
        if self.ended:
            return []
        if self._harmony is not None:
            return self._messages(*self._harmony.feed(text))
        if self._splitter is None:
            return self._content(text, final=False)
        reasoning, content = self._splitter.feed(text)
        return self._reasoning(reasoning) + self._content(content, final=False)

    def finish(self, cut: bool = False) -> list[Delta]:
        """What was held back, once the output has ended; `cut`: it ended at max_tokens (or
        was stopped), so a call still being written is dropped."""
        if self.ended:
            return []
        if self._harmony is not None:
            return self._messages(*self._harmony.finish(cut))
        out: list[Delta] = []
        if self._splitter is not None:
            reasoning, content = self._splitter.finish()
            out += self._reasoning(reasoning) + self._content(content, final=False)
        return out + self._content("", final=True, cut=cut)

    def finish_reason(self, worker_reason: FinishReason) -> Reason:
        """"tool_calls" once a call was made, also when max_tokens cut a later call short
        (that one is dropped) or the calls ended in a repeat."""
        return "tool_calls" if self.calls else worker_reason

    def _reasoning(self, text: str) -> list[Delta]:
        if not text:
            return []
        self.reasoning_text += text
        return [ReasoningDelta(self.choice, text)]

    def _messages(self, reasoning: str, pieces: list[str | Call]) -> list[Delta]:
        """A messages format's reasoning and pieces (harmony's, Functionary's); reasoning is
        content where it is off, and a call is text where no tools were offered."""
        if self.tools is None:
            pieces = [p if isinstance(p, str) else p.raw for p in pieces]
        if not self.reasoning:
            return self._pieces([reasoning, *pieces] if reasoning else pieces)
        return self._reasoning(reasoning) + self._pieces(pieces)

    def _content(self, text: str, final: bool, cut: bool = False) -> list[Delta]:
        if self._parser is None:
            pieces: list[str | Call] = [text] if text else []
        else:
            pieces = self._parser.feed(text) if text else []
            if final:
                pieces += self._parser.finish(cut)
        return self._pieces(pieces, final)

    def _pieces(self, pieces: list[str | Call], final: bool = False) -> list[Delta]:
        if self._unwrap is not None:
            unwrapped: list[str | Call] = [self._unwrap.feed(p) if isinstance(p, str) else p for p in pieces]
            pieces = [*unwrapped, self._unwrap.finish()] if final else unwrapped
        out: list[Delta] = []
        for p in pieces:
            if not isinstance(p, str) and self.declared is not None and p.name not in self.declared:
                p = p.raw  # not a function the client has: its text, as the model wrote it
            if isinstance(p, str):
                if p:
                    self.content += p
                    out.append(TextDelta(self.choice, p))
                continue
            key = (p.name, _canonical(p.arguments))
            if key in self._seen:
                self.ended = True
                break
            self._seen.add(key)
            made = MadeCall(len(self.calls), call_id(self.tools, p.id, p.name, len(self.calls)), p.name, p.arguments)
            self.calls.append(made)
            out.append(ToolCallStart(self.choice, made.index, made.id, made.name))
            out.append(ToolCallDelta(self.choice, made.index, made.arguments))
            out.append(ToolCallEnd(self.choice, made.index))
        return out


def _canonical(arguments: str) -> str:
    """Arguments compared as JSON values, not as text (key order and spacing aside)."""
    try:
        return json.dumps(json_text.loads(arguments), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return arguments
