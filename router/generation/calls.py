"""A tool call as read from a model's output, and reading one from decoded JSON: shared
by the streaming parser (router/generation/tool_calls.py) and the readers of each family's
sections (router/generation/tool_blocks.py). Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from router.server import json_text


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # JSON text
    id: str | None = None  # the model's own id, where its format has one (Mistral's)
    # The text the call was read from: what becomes content if the call is not taken.
    raw: str = field(default="", compare=False)


def json_end(text: str) -> int | None:
    """Where the JSON object or array that `text` starts with ends (the index after its
    closing bracket), or None while it is still open. Only brackets and strings are
    followed, so this does not say it is valid JSON; json_text.loads does that after."""
    return JsonScanner().end(text)


def arguments_whole(arguments: str) -> bool:
    """Whether a call's arguments (JSON text; none is the empty object) are the JSON
    object every dialect's call holds, rather than text cut short or of another kind."""
    try:
        return isinstance(json_text.loads(arguments or "{}"), dict)
    except ValueError:
        return False


def _arguments_text(args: Any) -> str:
    """A call's arguments as the JSON text OpenAI's `function.arguments` holds."""
    if isinstance(args, str):
        try:
            json_text.loads(args)
            return args  # already JSON text (some models write it that way)
        except ValueError:
            pass
    return json.dumps(args, ensure_ascii=False)


def call_from(obj: Any, raw: str = "") -> Call | None:
    """A call from one decoded JSON object, or None if it is not one."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    call_id = obj.get("id")
    return Call(name=name, arguments=_arguments_text(args), id=call_id if isinstance(call_id, str) else None, raw=raw)


class JsonScanner:
    """`json_end`, resumable: a parser fed a stream asks again with the same text and more
    after it, and only what was appended is scanned. Scanning the whole text on every
    token made a call with 20 KB of arguments cost the router 2.3 s of CPU, growing with
    the square of its length. `items` holds where each item of the array `text` starts
    with ends (where the depth comes back to 1), for a section read call by call."""

    def __init__(self) -> None:
        self._reset("")

    def _reset(self, text: str) -> None:
        self._seen = text[:0]
        self._depth = 0
        self._in_string = self._escaped = False
        self._end: int | None = None
        self.items: list[int] = []

    def end(self, text: str) -> int | None:
        """Where the JSON object or array `text` starts with ends, or None while open."""
        if not text.startswith(self._seen):
            self._reset(text)
        if self._end is not None:
            return self._end
        depth, in_string, escaped = self._depth, self._in_string, self._escaped
        for i in range(len(self._seen), len(text)):
            ch = text[i]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 1:
                    self.items.append(i + 1)
                elif depth == 0:
                    self._end = i + 1
                    break
        self._depth, self._in_string, self._escaped = depth, in_string, escaped
        self._seen = text if self._end is None else text[: self._end]
        return self._end
