"""muse-glimmer's output: its generation prompt ends with `<|start|>assistant`, and each
message is a recipient, `<|message|>`, and a body ended by `<|eom|>` (more follows, after
another `<|start|>assistant`) or `<|eot|>`:

    to=self<|message|>REASONING<|eom|><|start|>assistant to=user<|message|>CONTENT<|eot|>
    to=NAME<|message|><atem:function_calls><atem:invoke name="NAME"><atem:parameter name="K">V</atem:parameter>...

`self` is reasoning, `user` content, any other recipient a call block (llama.cpp's
muse_glimmer handler, common/chat.cpp, and its tests/test-chat.cpp). Output without a
recipient is content. Pure.
"""

from __future__ import annotations

import re

from router.generation.calls import call_from
from router.generation.reasoning import past_marker, release
from router.generation.tagged_calls import ParamTypes, minimax_calls
from router.generation.tool_calls import Piece
from router.server import json_text

START, MESSAGE = "<|start|>assistant", "<|message|>"
ENDS = ("<|eom|>", "<|eot|>")
_RECIPIENT = re.compile(r"^\s*to=(\S+?)\s*$")


class MuseParser:
    """Feed text; get (reasoning, content pieces) back."""

    def __init__(self, types: ParamTypes | None = None) -> None:
        self._types = types or {}
        self._buf = ""
        self._state = "header"  # "header", "body", "between"
        self._kind = "content"  # the body's: "reasoning", "content" or "call"
        self._first = True
        self._recipient = ""

    def feed(self, text: str) -> tuple[str, list[Piece]]:
        self._buf += text
        reasoning = ""
        pieces: list[Piece] = []
        while True:
            if self._state == "between":
                # Between messages only the next one's start is expected.
                self._buf, found = past_marker(self._buf, START)
                if not found:
                    return reasoning, pieces
                self._state = "header"
                continue
            if self._state == "header":
                at = self._buf.find(MESSAGE)
                head = self._buf if at < 0 else self._buf[:at]
                if self._first and not head.lstrip().startswith("to=") and not "to=".startswith(head.lstrip()):
                    self._state, self._kind, self._first = "body", "content", False  # no recipient at all
                    continue
                if at < 0:
                    return reasoning, pieces
                m = _RECIPIENT.match(head)
                recipient = self._recipient = m.group(1) if m else "user"
                self._kind = "reasoning" if recipient == "self" else "content" if recipient == "user" else "call"
                self._buf, self._state, self._first = self._buf[at + len(MESSAGE) :], "body", False
                continue
            ends = [(i, e) for e in ENDS if (i := self._buf.find(e)) >= 0]
            if not ends:
                if self._kind == "call":
                    return reasoning, pieces  # a call block comes out whole
                out, self._buf = release(self._buf, ENDS)
                r, p = self._route(out)
                return reasoning + r, pieces + p
            i, marker = min(ends)
            body, self._buf = self._buf[:i], self._buf[i + len(marker) :]
            r, p = self._route(body)
            reasoning, pieces = reasoning + r, pieces + p
            self._state = "between"

    def finish(self, cut: bool = False) -> tuple[str, list[Piece]]:
        rest, self._buf = self._buf, ""
        if self._state != "body":
            return "", [rest] if self._first and rest else []
        if self._kind == "call" and cut:
            return "", []
        return self._route(rest)

    def _route(self, text: str) -> tuple[str, list[Piece]]:
        if self._kind == "reasoning":
            return text, []
        if self._kind == "content":
            return "", [text] if text else []
        plain = text.replace("<atem:", "<").replace("</atem:", "</")
        calls = minimax_calls(plain, self._types)
        if not calls:  # a forced call's layout: the recipient's JSON arguments in the block
            args = plain.replace("<function_calls>", "").replace("</function_calls>", "").strip()
            try:
                call = call_from({"name": self._recipient, "arguments": json_text.loads(args)}, text)
            except ValueError:
                call = None
            calls = [call] if call is not None else []
        return "", list(calls) if calls else ([text] if text else [])
