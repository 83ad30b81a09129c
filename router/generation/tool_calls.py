"""Finding tool calls in a model's output as it streams, in the model's own format.

Formats (worker/chat_formats.py says which a model has):
- hermes: content, then `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks.
- llama3: a JSON object `{"name": ..., "parameters": ...}` as the whole output, or after
  `<|python_tag|>`.
- mistral: content, then `[TOOL_CALLS]` and a JSON array of `{"name", "arguments"}`.
- generic: the whole output is a JSON object: `{"tool_calls": [...]}` (or llama.cpp's
  `{"tool_call": {...}}`) to call, `{"response": "..."}` to answer.

Text that cannot be a call streams as content at once; only what may still become a
marker, or a call still being written, is held back. The calls of an array (generic's
`tool_calls`, mistral's) come out one by one as each is complete, not when the array is.
A call that never completes or does not parse is content after all, as llama.cpp treats
it, unless the output was cut (max_tokens, or the router ending it): then the call being
written is dropped, and the whole calls before it stand (issue 20: a forced call cut by
max_tokens came back as content). Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import re
from typing import Any, Union

from router.generation.calls import Call, JsonScanner, call_from
from router.generation import tool_blocks
from router.generation.reasoning import held_suffix
from router.generation.tagged_calls import ParamTypes, tagged_hermes
from router.server import json_text
from worker.chat_formats import BLOCKS, HERMES_CLOSE, HERMES_OPEN, LLAMA3_PYTHON_TAG, MISTRAL_PREFIX
from worker.protocol import ToolFormat


# The head of generic's array of calls, as a grammar or a model lays it out.
_GENERIC_ARRAY = re.compile(r'\{\s*"tool_calls"\s*:\s*\[')
_GENERIC_HEAD = '{"tool_calls": ['


Piece = Union[str, Call]  # content text, or one whole call


def _calls(values: Any, raw: str) -> list[Call] | None:
    """Calls from a decoded list (or one object); None unless every item is a call. Each
    keeps the whole block's text, when there is one call."""
    items = values if isinstance(values, list) else [values]
    calls = [call_from(v, raw if len(items) == 1 else json.dumps(v, ensure_ascii=False)) for v in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


class ToolCallParser:
    """Feed content text; get pieces (content strings and whole calls) back."""

    def __init__(self, fmt: ToolFormat, types: ParamTypes | None = None) -> None:
        self._fmt = fmt
        self._types = types or {}  # the declared parameters' JSON types, for tagged values
        self._block = BLOCKS.get(fmt)  # a section format's markers
        # Calls of the section being written that are already out: each comes out once it
        # is whole, before the section closes (a model that writes call after call is then
        # seen to repeat itself, and a cut section keeps its whole calls).
        self._section_out = 0
        self._part_read = 0  # how much of the open section was read for whole calls
        self._early: list[Piece] = []
        # Where the JSON being written ends, read only as far as it is new (calls.py).
        self._scan = JsonScanner()
        self._items = JsonScanner()
        self._buf = ""
        # "start" (only whitespace so far), "content", "call" (a call being written),
        # "array" (inside an array of calls), or "after_call" (only whitespace since the
        # last call)
        self._state = "start"
        self._array_head = ""  # the text that opened the array being read
        self._array_calls = 0  # calls read from it so far
        self._array_close = "]"  # what closes it: "]", or "]" then "}" for generic
        self._marker = {"hermes": HERMES_OPEN, "mistral": MISTRAL_PREFIX, "llama3": LLAMA3_PYTHON_TAG}.get(fmt)
        if self._block is not None:
            self._marker = self._block[0]

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._buf:
            if not self._step(out):
                break
        return out

    def finish(self, cut: bool = False) -> list[Piece]:
        """The rest, once the output has ended; `cut`: it was cut short (max_tokens, or the
        router ended it), so a call still being written is dropped, not made content."""
        out: list[Piece] = []
        if self._state == "array":
            if cut or self._buf.strip() in ("", "]", "]}", "] }"):
                self._buf = ""
            elif not self._array_calls:
                self._buf = self._array_head + self._buf  # never a call: all of it is content
        elif self._state == "call":
            if cut:
                self._buf = ""
            else:
                calls = self._complete_calls(self._buf, final=True)
                if calls is not None:
                    out.extend(calls)
                    self._buf = ""
        if self._buf and self._state != "after_call":
            out.append(self._buf)
        self._buf, self._section_out, self._part_read = "", 0, 0
        return out

    # ---- one step of the state machine: True if it made progress ----------------------------

    def _step(self, out: list[Piece]) -> bool:
        if self._state == "start":
            stripped = self._buf.lstrip()
            if not stripped:
                return False
            # llama3 and generic write a call as a bare JSON object at the very start.
            if self._fmt in ("llama3", "generic") and stripped.startswith("{"):
                self._state, self._buf = "call", stripped
                return True
            self._state = "content"
            return True
        if self._state == "after_call":
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._state = "content"
            return True
        if self._state == "array":
            return self._array_step(out)
        if self._state == "content":
            if self._marker is None:  # generic: no marker after the start, all content
                out.append(self._buf)
                self._buf = ""
                return False
            i = self._buf.find(self._marker)
            if i < 0:
                cut = len(self._buf) - held_suffix(self._buf, self._marker)
                if cut:
                    out.append(self._buf[:cut])
                    self._buf = self._buf[cut:]
                return False
            if i:
                out.append(self._buf[:i])
            self._state, self._buf = "call", self._buf[i:]
            return True
        # "call": an array of calls is read call by call; anything else once it is whole
        if self._open_array():
            return True
        if self._may_open_array():
            return False
        calls = self._complete_calls(self._buf, final=False)
        if calls is None:
            out.extend(self._early)  # whole calls of a section still open
            self._early.clear()
            return False
        out.extend(calls)
        return True

    def _open_array(self) -> bool:
        """At an array of calls (generic's `{"tool_calls": [`, mistral's `[TOOL_CALLS][`):
        consume its head and read it call by call."""
        if self._fmt == "generic":
            m = _GENERIC_ARRAY.match(self._buf)
            if m is None:
                return False
            head, close = m.group(0), "]}"
        elif self._fmt == "mistral" and self._buf.startswith(MISTRAL_PREFIX):
            rest = self._buf[len(MISTRAL_PREFIX) :]
            lead = len(rest) - len(rest.lstrip())
            if rest[lead : lead + 1] != "[":
                return False
            head, close = self._buf[: len(MISTRAL_PREFIX) + lead + 1], "]"
        else:
            return False
        self._state, self._array_head, self._array_calls, self._array_close = "array", head, 0, close
        self._buf = self._buf[len(head) :]
        return True

    def _may_open_array(self) -> bool:
        """Whether the call being written may still turn out to open an array."""
        if self._fmt == "generic":
            squeezed = re.sub(r"\s+", "", self._buf)
            return _GENERIC_HEAD.replace(" ", "").startswith(squeezed)
        if self._fmt == "mistral":
            return not self._buf[len(MISTRAL_PREFIX) :].strip()
        return False

    def _array_step(self, out: list[Piece]) -> bool:
        """One call of the array, its end, or nothing until more text comes."""
        rest = self._buf.lstrip()
        if rest.startswith(","):
            rest = rest[1:].lstrip()
        if not rest:
            return False
        if rest[0] == "]":
            tail = rest[1:].lstrip()
            if self._array_close == "]}":
                if not tail:
                    return False  # the object's "}" is still to come
                if tail[0] == "}":
                    tail = tail[1:]
            self._buf, self._state = tail, "after_call"
            return True
        end = self._scan.end(rest) if rest[0] == "{" else None
        if end is None:
            if rest[0] == "{":
                return False  # a call still being written
            # Not a call: the array and what follows are content after all.
            self._buf, self._state = (self._array_head if not self._array_calls else "") + rest, "content"
            return True
        raw = rest[:end]
        try:
            call = call_from(json_text.loads(raw), raw)
        except ValueError:
            call = None
        self._buf = rest[end:]
        if call is None:
            out.append(raw)
        else:
            self._array_calls += 1
            out.append(call)
        return True

    def _complete_calls(self, text: str, final: bool) -> list[Piece] | None:
        """The pieces of a whole call at the start of `text` (consuming it from the buffer),
        or None while it is still being written. A whole block that is not a call becomes
        content. With `final`, an unclosed block is parsed as far as it goes."""
        body_start = 0
        if self._block is not None:
            return self._section(text, final)
        if self._fmt == "hermes":
            close = text.find(HERMES_CLOSE)
            if close < 0 and not final:
                return None
            body = text[len(HERMES_OPEN) : close if close >= 0 else len(text)]
            consumed = close + len(HERMES_CLOSE) if close >= 0 else len(text)
            try:
                call = call_from(json_text.loads(body), text[:consumed])
                calls = [call] if call else None
            except ValueError:  # Qwen3-Coder's and GLM's tagged bodies
                calls = tagged_hermes(body, self._types)
            return self._emit(calls, text, consumed)
        if self._fmt == "mistral" and text[len(MISTRAL_PREFIX) :].lstrip()[:1] not in ("[", "{", ""):
            return self._mistral_named(text, final)
        if self._fmt == "mistral" or (self._fmt == "llama3" and text.startswith(LLAMA3_PYTHON_TAG)):
            body_start = len(self._marker or "")
        rest = text[body_start:]
        lead = len(rest) - len(rest.lstrip())
        end = self._scan.end(rest[lead:]) if rest[lead:lead + 1] in ("{", "[") else None
        if end is None:
            if not final and (not rest[lead:] or rest[lead:lead + 1] in ("{", "[")):
                return None
            return self._emit(None, text, len(text))
        consumed = body_start + lead + end
        try:
            value = json_text.loads(rest[lead : lead + end])
        except ValueError:
            return self._emit(None, text, consumed)
        if self._fmt == "generic":
            return self._generic(value, text, consumed)
        return self._emit(_calls(value, text[:consumed]), text, consumed)

    def _section(self, text: str, final: bool) -> list[Piece] | None:
        """A block format's section, once its closing marker (or, for FireFunction, its
        JSON value) is in; with `final`, as far as it goes."""
        assert self._block is not None
        opening, closing = self._block
        rest = text[len(opening) :]
        if closing is None:
            lead = len(rest) - len(rest.lstrip())
            end = self._scan.end(rest[lead:]) if rest[lead : lead + 1] in ("[", "{") else None
            if end is None:
                if not final and (not rest[lead:] or rest[lead : lead + 1] in ("[", "{")):
                    return None
                return self._emit(None, text, len(text))
            consumed = len(opening) + lead + end
            body = rest[lead : lead + end]
        else:
            close = rest.find(closing)
            if close < 0 and not final:
                part = tool_blocks.whole_part(self._fmt, rest, self._items)
                if len(part) > self._part_read:  # a call more is whole: read them
                    self._part_read = len(part)
                    whole = tool_blocks.calls_in(self._fmt, part, self._types) or []
                    self._early.extend(whole[self._section_out :])
                    self._section_out = max(self._section_out, len(whole))
                return None
            body = rest if close < 0 else rest[:close]
            consumed = len(text) if close < 0 else len(opening) + close + len(closing)
        calls = tool_blocks.calls_in(self._fmt, body, self._types)
        done, self._section_out, self._part_read = self._section_out, 0, 0
        if done:  # some are out already: the rest of the section is theirs, never content
            self._buf, self._state = text[consumed:], "after_call"
            return list((calls or [])[done:])
        return self._emit(calls, text, consumed)

    def _mistral_named(self, text: str, final: bool) -> list[Piece] | None:
        """Mistral Small 3.2's and Devstral's calls: `[TOOL_CALLS]NAME[ARGS]{...}`, with
        `[CALL_ID]ID` before `[ARGS]` where the model writes one. None while it is still
        being written."""
        rest = text[len(MISTRAL_PREFIX) :]
        at = rest.find("[ARGS]")
        if at < 0:
            return None if not final else self._emit(None, text, len(text))
        head, args = rest[:at], rest[at + len("[ARGS]") :]
        name, _, own = head.partition("[CALL_ID]")
        lead = len(args) - len(args.lstrip())
        end = self._scan.end(args[lead:]) if args[lead : lead + 1] == "{" else None
        if end is None:
            if not final and (not args[lead:] or args[lead] == "{"):
                return None
            return self._emit(None, text, len(text))
        consumed = len(MISTRAL_PREFIX) + at + len("[ARGS]") + lead + end
        try:
            arguments = json_text.loads(args[lead : lead + end])
        except ValueError:
            return self._emit(None, text, consumed)
        call = call_from({"name": name.strip(), "arguments": arguments, "id": own.strip() or None}, text[:consumed])
        return self._emit([call] if call else None, text, consumed)

    def _generic(self, value: Any, text: str, consumed: int) -> list[Piece]:
        if isinstance(value, dict):
            if "tool_calls" in value:
                return self._emit(_calls(value["tool_calls"], text[:consumed]), text, consumed)
            if "tool_call" in value:
                return self._emit(_calls(value["tool_call"], text[:consumed]), text, consumed)
            if "response" in value and len(value) == 1:
                answer = value["response"]
                self._buf, self._state = text[consumed:], "content"
                return [answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)]
        return self._emit(None, text, consumed)

    def _emit(self, calls: list[Call] | None, text: str, consumed: int) -> list[Piece]:
        """Consume `text[:consumed]` as `calls`, or as content when it holds none."""
        self._buf = text[consumed:]
        if calls:
            # Whitespace between calls, or after the last, is no content; it is dropped
            # however the text was split, so a stream and a whole response agree.
            self._state = "after_call"
            return list(calls)
        self._state = "content"
        return [text[:consumed]]
