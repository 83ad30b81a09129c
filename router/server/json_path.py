"""Where in a raw JSON body a problem lies, so that a 400 can name the parameter.

msgspec names the key path of every type error itself. Two failures come without one:

- nesting deeper than the interpreter's recursion limit (`RecursionError`, about 1,000
  levels), which free-form fields such as `tool_choice` or an unknown key in a message let
  through;
- bytes that are not UTF-8 inside a string (`UnicodeDecodeError`).

For those, this module walks the raw body with a small lexer, on the error path only. It
visits strings and punctuation (numbers and literals are skipped) and crosses a string with
`bytes.find`, at memchr speed. Each token and each escape inside a string costs one unit of
a budget of `MAX_TOKENS`, so a hostile body costs at most a few tens of milliseconds. Past
the budget it answers None, and the error names no parameter.
"""

from __future__ import annotations

import re

# The walk gives up after this many tokens and escapes: about 50 ms.
MAX_TOKENS = 50_000
# A container this deep is certainly part of the nesting that broke the decoder (which
# fails near 1,000): no OpenAI request needs a tenth of it.
DEEP = 256
# A path longer than this is cut: the rest only repeats the nesting.
_REPORTED_COMPONENTS = 6
_KEY_CHARS = 64

_NEXT = re.compile(rb'["\[\]{},:]')  # the start of the next token
_QUOTE, _OPEN_OBJ, _OPEN_ARR = ord('"'), ord("{"), ord("[")
_CLOSE = frozenset(b"]}")


def too_deep(body: bytes | bytearray) -> str | None:
    """The parameter that holds the first container nested deeper than `DEEP` levels."""
    return _walk(body, deeper_than=DEEP, offset=None)


def invalid_utf8(body: bytes | bytearray) -> str | None:
    """The parameter whose string (value or key) holds the body's first invalid UTF-8."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _walk(body, deeper_than=None, offset=exc.start)
    return None


class _Frame:
    """One open container: an object (with the key whose value is being read) or an array
    (with the index of the element being read)."""

    __slots__ = ("is_object", "at", "expect_key")

    def __init__(self, is_object: bool) -> None:
        self.is_object = is_object
        self.at: str | int | None = None if is_object else 0
        self.expect_key = is_object


def _walk(body: bytes | bytearray, deeper_than: int | None, offset: int | None) -> str | None:
    stack: list[_Frame] = []
    pos = 0
    budget = MAX_TOKENS
    while budget > 0:
        budget -= 1
        m = _NEXT.search(body, pos)
        if m is None:
            return None
        start = m.start()
        c = body[start]
        top = stack[-1] if stack else None
        if c == _QUOTE:
            pos, budget = _string_end(body, start, budget)
            if top is not None and top.is_object and top.expect_key:
                top.at = _key(body[start:pos])
            if offset is not None and start <= offset < pos:
                return _format(stack)
            continue
        pos = start + 1
        if c == _OPEN_OBJ or c == _OPEN_ARR:
            stack.append(_Frame(c == _OPEN_OBJ))
            if deeper_than is not None and len(stack) > deeper_than:
                held = stack[:-1]  # the new frame has no place inside it yet
                return _format(held[: _run_start(held)])
        elif c in _CLOSE:
            if stack:
                stack.pop()
        elif top is not None:
            if c == ord(","):
                if top.is_object:
                    top.expect_key = True
                elif isinstance(top.at, int):
                    top.at += 1
            else:  # ":"
                top.expect_key = False
    return None


def _string_end(body: bytes | bytearray, start: int, budget: int) -> tuple[int, int]:
    """Just past the closing quote of the string that opens at `start`, and the budget
    left: each escape crossed costs one."""
    i = start + 1
    close = body.find(b'"', i)
    while budget > 0:
        if close < 0:
            return len(body), budget
        escape = body.find(b"\\", i, close)
        if escape < 0:
            return close + 1, budget
        i = escape + 2  # the escaped character, a quote perhaps, is skipped
        budget -= 1
        if i > close:  # that quote was escaped: look for the next one
            close = body.find(b'"', i)
    return len(body), 0


def _key(token: bytes | bytearray) -> str:
    text = token[1:-1].decode("utf-8", errors="replace")
    return text if len(text) <= _KEY_CHARS else text[:_KEY_CHARS] + "..."


def _run_start(stack: list[_Frame]) -> int:
    """Where the nesting begins: the first of the frames at the bottom of the stack that all
    sit in the same place of the same kind of container (`[[[[` or `{"a": {"a": ...`).
    The parameter is the path to that first one: `messages[0].x`, `prompt[1]`, not the
    thousand indices inside it."""
    j = len(stack) - 1
    while j > 0 and (stack[j - 1].is_object, stack[j - 1].at) == (stack[j].is_object, stack[j].at):
        j -= 1
    return j


def _format(stack: list[_Frame]) -> str | None:
    parts = [f.at for f in stack if f.at is not None][:_REPORTED_COMPONENTS]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else p
    return out or None
