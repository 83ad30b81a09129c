"""Functionary v3.2's output: its generation prompt ends with `>>>`, and the model writes
a recipient, a newline, and a body; `>>>` starts the next one:

    all\\nSome text for the user>>>get_weather\\n{"city": "Paris"}>>>now\\n{}

`all` is the answer's content; any other recipient is a call with the JSON that follows
(llama.cpp's functionary_v3_2 handler, common/chat.cpp; its tests/test-chat.cpp). Read
whether tools were offered or not: a plain answer starts with `all\\n` too. Pure.
"""

from __future__ import annotations

from router.generation.calls import JsonScanner, call_from
from router.generation.reasoning import held_suffix
from router.generation.tool_calls import Piece
from router.server import json_text

SEPARATOR = ">>>"


class FunctionaryParser:
    """Feed text; get ("", pieces) back (this format has no reasoning)."""

    def __init__(self) -> None:
        self._buf = ""
        self._state = "recipient"  # "recipient" (before its newline), "content", "call", "between"
        self._name = ""
        self._scan = JsonScanner()  # the arguments being written, read as far as they are new

    def feed(self, text: str) -> tuple[str, list[Piece]]:
        self._buf += text
        pieces: list[Piece] = []
        while self._step(pieces, final=False):
            pass
        return "", pieces

    def finish(self, cut: bool = False) -> tuple[str, list[Piece]]:
        pieces: list[Piece] = []
        while self._step(pieces, final=True):
            pass
        rest, self._buf = self._buf, ""
        if self._state == "call" and not cut and rest:
            pieces.append(rest)  # arguments that never closed: as written
        elif self._state in ("content", "recipient") and rest:
            pieces.append(rest)
        return "", pieces

    def _step(self, pieces: list[Piece], final: bool) -> bool:
        if self._state == "between":
            rest = self._buf.lstrip()
            if rest.startswith(SEPARATOR):
                self._buf, self._state = rest[len(SEPARATOR) :], "recipient"
                return True
            if not rest or (SEPARATOR.startswith(rest) and not final):
                self._buf = rest
                return False
            self._buf, self._state = rest, "content"  # text after a call: content
            return True
        if self._state == "recipient":
            at = self._buf.find("\n")
            if at < 0:
                # A recipient is a name; anything longer or odder is a plain answer.
                if len(self._buf) > 64 or " " in self._buf.strip() or final:
                    self._state = "content"
                    return bool(self._buf)
                return False
            self._name, self._buf = self._buf[:at].strip(), self._buf[at + 1 :]
            self._state = "content" if self._name == "all" else "call"
            return True
        if self._state == "content":
            at = self._buf.find(SEPARATOR)
            if at < 0:
                keep = 0 if final else held_suffix(self._buf, SEPARATOR)
                out, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
                if out:
                    pieces.append(out)
                return False
            if at:
                pieces.append(self._buf[:at])
            self._buf, self._state = self._buf[at + len(SEPARATOR) :], "recipient"
            return True
        # "call": JSON arguments
        rest = self._buf.lstrip()
        end = self._scan.end(rest) if rest[:1] == "{" else None
        if end is None:
            if rest and rest[0] != "{":  # not arguments: the recipient line was content
                self._buf, self._state = f"{self._name}\n{self._buf}", "content"
                return True
            return False
        raw = rest[:end]
        try:
            call = call_from({"name": self._name, "arguments": json_text.loads(raw)}, f"{self._name}\n{raw}")
        except ValueError:
            call = None
        pieces.append(call if call is not None else f"{self._name}\n{raw}")
        self._buf, self._state = rest[end:], "between"
        return True
