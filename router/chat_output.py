"""A chat reply's text stream turned into OpenAI's parts: content, reasoning_content and
tool calls, as streamed deltas and as the whole message.

Reasoning is split off first (router/reasoning.py), and tool calls are looked for only in
what remains (router/tool_calls.py), so a call the model merely thinks about is not made.
Pure: the router feeds it the worker's text.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from router.reasoning import ReasoningSplitter
from router.tool_calls import Call, ToolCallParser
from worker.protocol import ToolFormat

_ALNUM = string.ascii_letters + string.digits


@dataclass(frozen=True)
class MadeCall:
    index: int
    id: str
    name: str
    arguments: str

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def call_id(fmt: ToolFormat | None, own: str | None) -> str:
    """An id for a call. Mistral's templates refuse any id but 9 letters and digits, which
    is what its models write, so a Mistral-format model keeps or gets one of those;
    everyone else gets OpenAI's "call_" ids."""
    if fmt == "mistral":
        if own is not None and len(own) == 9 and own.isalnum():
            return own
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return "call_" + secrets.token_hex(12)


@dataclass
class ChatOutput:
    """Feed the worker's text; get OpenAI delta objects back (each the `delta` of one
    chunk). The whole reply accumulates in `content`, `reasoning` and `calls`."""

    tools: ToolFormat | None  # None: no tools were offered; all text is content
    reasoning: bool  # split <think> blocks off
    in_reasoning: bool = False  # the prompt ended inside an open block
    content: str = ""
    reasoning_text: str = ""
    calls: list[MadeCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._splitter = ReasoningSplitter(self.in_reasoning) if self.reasoning else None
        self._parser = ToolCallParser(self.tools) if self.tools is not None else None

    def feed(self, text: str) -> list[dict[str, Any]]:
        if self._splitter is None:
            return self._content(text, final=False)
        reasoning, content = self._splitter.feed(text)
        return self._reasoning(reasoning) + self._content(content, final=False)

    def finish(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._splitter is not None:
            reasoning, content = self._splitter.finish()
            out += self._reasoning(reasoning) + self._content(content, final=False)
        return out + self._content("", final=True)

    def finish_reason(self, worker_reason: str) -> str:
        """OpenAI's finish_reason: "tool_calls" once a call was made."""
        return "tool_calls" if self.calls and worker_reason in ("stop", "length") else worker_reason

    def message(self) -> dict[str, Any]:
        """The whole reply's `message` object."""
        msg: dict[str, Any] = {
            "role": "assistant",
            # OpenAI's content is null beside tool calls when the model wrote nothing else.
            "content": None if self.calls and not self.content.strip() else self.content,
            "refusal": None,
        }
        if self.calls:
            msg["tool_calls"] = [c.json() for c in self.calls]
        if self.reasoning_text:
            msg["reasoning_content"] = self.reasoning_text
        return msg

    def _reasoning(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        self.reasoning_text += text
        return [{"reasoning_content": text}]

    def _content(self, text: str, final: bool) -> list[dict[str, Any]]:
        if self._parser is None:
            pieces: list[str | Call] = [text] if text else []
        else:
            pieces = self._parser.feed(text) if text else []
            if final:
                pieces += self._parser.finish()
        out: list[dict[str, Any]] = []
        for p in pieces:
            if isinstance(p, str):
                if p:
                    self.content += p
                    out.append({"content": p})
                continue
            made = MadeCall(len(self.calls), call_id(self.tools, p.id), p.name, p.arguments)
            self.calls.append(made)
            # OpenAI's streaming shape: the id, type and name first, then the arguments.
            out.append(
                {
                    "tool_calls": [
                        {"index": made.index, "id": made.id, "type": "function", "function": {"name": made.name, "arguments": ""}}
                    ]
                }
            )
            out.append({"tool_calls": [{"index": made.index, "function": {"arguments": made.arguments}}]})
        return out
