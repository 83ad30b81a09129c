"""GPT-OSS's output (OpenAI's harmony format), read as it streams: a sequence of messages,
each a header, `<|message|>`, a body, and an end marker. The generation prompt ends with
`<|start|>assistant`, so the output opens with the first message's header:

    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>final<|message|>CONTENT<|return|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>

`analysis` bodies are reasoning; `final` bodies, and `commentary` without a recipient (a
preamble), are content; a body addressed `to=functions.NAME` (in the channel's header or
the role's, `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`) is
a call with those arguments. Calls to built-in tools (`to=python`, `to=browser.search`) are
not the client's: their text is dropped, as llama.cpp drops it (common/chat.cpp, its
gpt_oss handler). Output that starts without a header is content. Pure.
"""

from __future__ import annotations

import re

from router.generation.calls import call_from
from router.generation.reasoning import past_marker, release
from router.generation.tool_calls import Piece
from router.server import json_text

from worker.chat_formats import HARMONY_MARKERS

# The worker renders these as text (worker/chat_formats.py, PRESERVED_MARKERS).
START, CHANNEL, MESSAGE, _CONSTRAIN, *_ends = HARMONY_MARKERS
ENDS = tuple(_ends)

_RECIPIENT = re.compile(r"to=([^\s<]+)")


class HarmonyParser:
    """Feed text; get (reasoning, content pieces) back, pieces being text or whole calls."""

    def __init__(self) -> None:
        self._buf = ""
        self._state = "header"  # "header" (before <|message|>), "body", "between" (after an end)
        self._kind = "content"  # the body's: "reasoning", "content", "call" or "drop"
        self._recipient = ""
        self._first = True  # nothing read yet: output without a header is content

    def feed(self, text: str) -> tuple[str, list[Piece]]:
        self._buf += text
        reasoning = ""
        pieces: list[Piece] = []
        while True:
            if self._state == "header":
                if self._first and not self._buf.startswith((CHANNEL, START)) and not any(
                    m.startswith(self._buf) for m in (CHANNEL, START)
                ):
                    # No header at all: the model answered plainly.
                    self._state, self._kind, self._first = "body", "content", False
                    continue
                at = self._buf.find(MESSAGE)
                if at < 0:
                    return reasoning, pieces
                self._open(self._buf[:at])
                self._buf, self._state, self._first = self._buf[at + len(MESSAGE) :], "body", False
                continue
            if self._state == "between":
                # Between messages only the next one's start is expected.
                self._buf, found = past_marker(self._buf, START)
                if not found:
                    return reasoning, pieces
                self._state = "header"
                continue
            # "body": up to the first end marker
            ends = [(i, m) for m in ENDS if (i := self._buf.find(m)) >= 0]
            if not ends:
                if self._kind == "call":
                    return reasoning, pieces  # a call's arguments come out whole
                out, self._buf = release(self._buf, ENDS)
                r, p = self._route(out)
                reasoning += r
                pieces += p
                return reasoning, pieces
            i, marker = min(ends)
            body, self._buf = self._buf[:i], self._buf[i + len(marker) :]
            r, p = self._route(body, whole=True)
            reasoning += r
            pieces += p
            self._state = "between"

    def finish(self, cut: bool = False) -> tuple[str, list[Piece]]:
        """The rest once the output has ended (a model's last message often has no end
        marker: <|return|> and <|call|> end the generation and are not written). `cut`: a
        call still being written is dropped."""
        rest, self._buf = self._buf, ""
        if self._state != "body":
            return "", [rest] if self._first and rest else []
        if self._kind == "call" and cut:
            return "", []
        return self._route(rest, whole=True)

    def _open(self, header: str) -> None:
        """A message's header: its channel and recipient say what its body is."""
        m = _RECIPIENT.search(header)
        self._recipient = m.group(1) if m else ""
        channel = header.split(CHANNEL, 1)[1] if CHANNEL in header else ""
        channel = channel.split()[0] if channel.split() else ""
        if self._recipient.startswith("functions."):
            self._kind = "call"
        elif self._recipient and self._recipient != "assistant":
            self._kind = "drop"  # a built-in tool's call
        elif channel == "analysis":
            self._kind = "reasoning"
        else:
            self._kind = "content"  # final, or a commentary preamble

    def _route(self, text: str, whole: bool = False) -> tuple[str, list[Piece]]:
        if self._kind == "reasoning":
            return text, []
        if self._kind == "content":
            return "", [text] if text else []
        if self._kind == "call" and whole:
            name = self._recipient[len("functions.") :]
            try:
                call = call_from({"name": name, "arguments": json_text.loads(text)}, text)
            except ValueError:
                call = None
            return "", [call] if call is not None else [text]
        return "", []
