"""Validating a chat request's tools, tool_choice and tool-call messages.

Every failure is an InvalidRequest naming the parameter (`tools[0].function.name`,
`tool_choice`, `messages[2].tool_calls[0].id`), with OpenAI's rules: function names of at
most 64 letters, digits, `_` or `-`; parameters a JSON schema object; a named or required
tool_choice only with tools, naming a declared one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from supervisor.errors import InvalidRequest
from worker.protocol import ToolCall

_NAME = re.compile(r"[a-zA-Z0-9_-]+")
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


@dataclass(frozen=True)
class ToolRequest:
    """What a request asks of tools, validated.

    `offered`: the tools the prompt describes (none for tool_choice "none").
    `forced`: the tools one of which must be called ("required": all; a named choice: that
    one), or None where the model may answer instead.
    `withheld`: the tools given with tool_choice "none", which the prompt leaves out, for
    an upstream that is sent them with its own "none" (Anthropic's API refuses a
    conversation with tool calls in it and no tools).
    """

    offered: tuple[dict[str, Any], ...] | None = None
    forced: tuple[dict[str, Any], ...] | None = None
    parallel: bool = True
    withheld: tuple[dict[str, Any], ...] | None = None


def _fail(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param)


def _tool(i: int, t: Any, longest: int) -> dict[str, Any]:
    at = f"tools[{i}]"
    if not isinstance(t, dict):
        raise _fail(f"Invalid type for '{at}': expected an object.", at)
    if t.get("type") != "function":
        raise _fail(f"Invalid value for '{at}.type': only 'function' tools are supported.", f"{at}.type")
    unknown = set(t) - {"type", "function"}
    if unknown:
        raise _fail(f"Unrecognized request argument supplied: {at}.{sorted(unknown)[0]}", f"{at}.{sorted(unknown)[0]}")
    f = t.get("function")
    if not isinstance(f, dict):
        raise _fail(f"Missing required parameter: '{at}.function'.", f"{at}.function")
    unknown = set(f) - _FUNCTION_KEYS
    if unknown:
        key = f"{at}.function.{sorted(unknown)[0]}"
        raise _fail(f"Unrecognized request argument supplied: {key}", key)
    name = f.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > longest:
        raise _fail(
            f"Invalid '{at}.function.name': expected a string of 1 to {longest} letters, digits, "
            f"underscores or dashes, got {name!r}.",
            f"{at}.function.name",
        )
    if "description" in f and not isinstance(f["description"], str):
        raise _fail(f"Invalid type for '{at}.function.description': expected a string.", f"{at}.function.description")
    if "strict" in f and not isinstance(f["strict"], (bool, type(None))):
        raise _fail(f"Invalid type for '{at}.function.strict': expected a boolean.", f"{at}.function.strict")
    params = f.get("parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise _fail(f"Invalid type for '{at}.function.parameters': expected a JSON schema object.", f"{at}.function.parameters")
        if params.get("type", "object") != "object":
            raise _fail(
                f"Invalid schema for function '{name}': the parameters schema must be of type "
                f"'object', got {params.get('type')!r}.",
                f"{at}.function.parameters",
            )
    return {"type": "function", "function": f}


def tool_request(
    tools: list[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None, longest_name: int = 64
) -> ToolRequest:
    """Validate tools, tool_choice and parallel_tool_calls together. `longest_name`: the
    longest function name taken (OpenAI's 64; Anthropic's 128, which MCP tools' long
    names need)."""
    checked: list[dict[str, Any]] = []
    # `tools: []` is a request without tools, whatever tool_choice says (as llama-server:
    # tools/server/server-common.cpp, `has_tools = tools.is_array() && !tools.empty()`);
    # the Ollama client and LangChain send it with every request.
    if tools:
        names: set[str] = set()
        for i, t in enumerate(tools):
            tool = _tool(i, t, longest_name)
            name = tool["function"]["name"]
            if name in names:
                raise _fail(f"Invalid 'tools': the function name {name!r} is declared twice.", f"tools[{i}].function.name")
            names.add(name)
            checked.append(tool)
    choice = _choice(tool_choice, checked)
    parallel = True if parallel_tool_calls is None else parallel_tool_calls
    if choice == "none" or not checked:
        return ToolRequest(parallel=parallel, withheld=tuple(checked) or None)
    offered = tuple(checked)
    if choice == "auto":
        return ToolRequest(offered=offered, parallel=parallel)
    if choice == "required":
        return ToolRequest(offered=offered, forced=offered, parallel=parallel)
    forced = tuple(t for t in checked if t["function"]["name"] == choice[1])
    return ToolRequest(offered=offered, forced=forced, parallel=parallel)


def _choice(tool_choice: Any, tools: list[dict[str, Any]]) -> Literal["none", "auto", "required"] | tuple[str, str]:
    """The choice as "none", "auto", "required", or ("function", name)."""
    if tool_choice is None:
        return "auto" if tools else "none"
    if tool_choice in ("none", "auto", "required"):
        return tool_choice if tools else "none"
    if isinstance(tool_choice, dict):
        f = tool_choice.get("function")
        name = f.get("name") if isinstance(f, dict) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str) or set(tool_choice) - {"type", "function"}:
            raise _fail(
                "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": ...}}.',
                "tool_choice",
            )
        if not tools:
            return "none"  # nothing to call: as llama-server, the choice has no effect
        if all(t["function"]["name"] != name for t in tools):
            raise _fail(f"Invalid value for 'tool_choice': no function named {name!r} in 'tools'.", "tool_choice")
        return ("function", name)
    raise _fail(
        "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
        '{"type": "function", "function": {"name": ...}}.',
        "tool_choice",
    )


def message_tool_calls(at: str, calls: Any) -> list[ToolCall]:
    """An assistant message's `tool_calls`, validated."""
    if not isinstance(calls, list):
        raise _fail(f"Invalid type for '{at}.tool_calls': expected an array.", f"{at}.tool_calls")
    out = []
    for j, c in enumerate(calls):
        cat = f"{at}.tool_calls[{j}]"
        if not isinstance(c, dict):
            raise _fail(f"Invalid type for '{cat}': expected an object.", cat)
        if c.get("type", "function") != "function":
            raise _fail(f"Invalid value for '{cat}.type': expected 'function'.", f"{cat}.type")
        if not isinstance(c.get("id"), str):
            raise _fail(f"Missing required parameter: '{cat}.id'.", f"{cat}.id")
        f = c.get("function")
        if not isinstance(f, dict):
            raise _fail(f"Missing required parameter: '{cat}.function'.", f"{cat}.function")
        if not isinstance(f.get("name"), str):
            raise _fail(f"Missing required parameter: '{cat}.function.name'.", f"{cat}.function.name")
        if not isinstance(f.get("arguments"), str):
            raise _fail(
                f"Invalid type for '{cat}.function.arguments': expected a string of JSON.",
                f"{cat}.function.arguments",
            )
        out.append(ToolCall(id=c["id"], name=f["name"], arguments=f["arguments"]))
    return out


def optional_string(at: str, m: dict[str, Any], key: str) -> str | None:
    v = m.get(key)
    if v is not None and not isinstance(v, str):
        raise _fail(f"Invalid type for '{at}.{key}': expected a string.", f"{at}.{key}")
    return v
