"""Splitting a model's <think>...</think> reasoning from its answer, as the text streams
(or its family's own tags: Command R7B's <|START_THINKING|>, Magistral's [THINK], ...).

A reasoning block counts only at the start of the output (after whitespace), or when the
prompt itself ended inside one (the worker says so with the first event); a `<think>` later
in an answer is content. Only text that may still become a tag is held back.

A prompt that ended inside a block, answered at once with a tool call's opening marker,
did not think at all: the call is the answer (a forced call's grammar writes the marker
from the first token; MiniMax M2's template always opens the block). llama.cpp ends
reasoning at the call's marker likewise for Qwen3-Coder's and Ling's formats. Pure.
"""

from __future__ import annotations

from worker.chat_formats import THINK_CLOSE, THINK_OPEN


def held_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper start of `marker`: the
    part that must wait for more text before it is known not to be the marker."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def past_marker(buf: str, marker: str) -> tuple[str, bool]:
    """What follows the first `marker` in `buf`, and True; while it has not come, only the
    end of `buf` that may still begin it, and False (the rest is no one's text)."""
    at = buf.find(marker)
    if at < 0:
        keep = held_suffix(buf, marker)
        return (buf[len(buf) - keep :] if keep else ""), False
    return buf[at + len(marker) :], True


def release(buf: str, markers: tuple[str, ...]) -> tuple[str, str]:
    """`buf` split into what is certain to be text (no start of any of `markers` at its
    end) and what must wait for more."""
    keep = max(held_suffix(buf, m) for m in markers)
    return buf[: len(buf) - keep], buf[len(buf) - keep :]


class ReasoningSplitter:
    """Feed output text; get (reasoning, content) pieces back.

    `feed` never blocks and returns what is certain so far; `finish` returns the rest.
    """

    def __init__(
        self,
        in_reasoning: bool = False,
        call_markers: tuple[str, ...] = (),
        tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE),
    ) -> None:
        self._open, self._close = tags  # the family's block (worker/chat_formats.py)
        # "start": nothing but whitespace seen; "reasoning": inside a block; "content": after.
        self._state = "reasoning" if in_reasoning else "start"
        self._buf = ""
        self._trim_next = in_reasoning  # the first reasoning text drops leading newlines
        # Markers that open a tool call: one first thing in a block the prompt opened means
        # no reasoning at all (see the module's docstring). Cleared once reasoning shows.
        self._call_markers = call_markers if in_reasoning else ()

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning = ""
        if self._state == "start":
            stripped = self._buf.lstrip()
            if stripped.startswith(self._open):
                self._state, self._buf = "reasoning", stripped[len(self._open) :]
                self._trim_next = True
            elif self._open.startswith(stripped):
                return "", ""  # empty, whitespace, or a start of the tag: wait
            else:
                self._state = "content"
        if self._state == "reasoning" and self._call_markers:
            stripped = self._buf.lstrip()
            if not stripped or any(m.startswith(stripped) and m != stripped for m in self._call_markers):
                return "", ""  # nothing yet, or a start of a marker: wait
            if any(stripped.startswith(m) for m in self._call_markers):
                self._state, self._buf, self._call_markers = "content", stripped, ()
                return "", self._flush()
            self._call_markers = ()
        if self._state == "reasoning":
            if self._trim_next:
                self._buf = self._buf.lstrip("\n")
                self._trim_next = not self._buf
            i = self._buf.find(self._close)
            if i < 0:
                # Hold back a possible start of the tag, and newlines that may turn out to
                # be the ones before it (which reasoning_content leaves out).
                cut = len(self._buf) - held_suffix(self._buf, self._close)
                cut = len(self._buf[:cut].rstrip("\n"))
                reasoning, self._buf = self._buf[:cut], self._buf[cut:]
                return reasoning, ""
            reasoning = self._buf[:i].rstrip("\n")
            self._buf = self._buf[i + len(self._close) :].lstrip()
            self._state = "content"
            if not self._buf:
                self._state = "after"
                return reasoning, ""
        if self._state == "after":
            # Right after </think>: the whitespace that separates it from the answer goes.
            self._buf = self._buf.lstrip()
            if not self._buf:
                return reasoning, ""
            self._state = "content"
        return reasoning, self._flush()

    def _flush(self) -> str:
        content, self._buf = self._buf, ""
        return content

    def finish(self) -> tuple[str, str]:
        """What was held back, once the output has ended: an unclosed block is reasoning;
        a lone start of a tag is content."""
        rest, self._buf = self._buf, ""
        if self._state == "reasoning":
            return rest, ""
        if self._state == "after":
            return "", ""
        return "", rest


class MarkerStripper:
    """Drops `markers` from streamed text, holding back only what may still become one."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self._markers = markers
        self._buf = ""

    def feed(self, text: str) -> str:
        self._buf += text
        for m in self._markers:
            self._buf = self._buf.replace(m, "")
        keep = max((held_suffix(self._buf, m) for m in self._markers), default=0)
        out, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        return out

    def finish(self) -> str:
        rest, self._buf = self._buf, ""
        return rest
