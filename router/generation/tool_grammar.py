"""The grammar that forces a tool call: tool_choice "required" or a named function.

The output must then be a call, in the model's own format, to one of the offered functions,
with arguments that match that function's parameters schema. The grammar is Lark in
llguidance's dialect, which embeds each JSON schema with `%json`; the worker enforces it
while sampling (a Constraint in SamplingParams). Pure: tests check that every grammar
compiles with llguidance.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from router.generation.schema_rewrite import SchemaTooDeep, narrowed, relocated
from supervisor.errors import InvalidRequest
from worker.chat_formats import HERMES_CLOSE, HERMES_OPEN, MISTRAL_PREFIX
from worker.protocol import JSON_LAYOUT, Constraint, ToolFormat

_ANY_OBJECT: dict[str, Any] = {"type": "object"}

# The most calls one forced answer may hold with parallel calls allowed. A model that
# will not end its calls (the demo model wrote call after call until max_tokens) is then
# made to end after this many, and repeats end sooner (router/generation/chat_output.py). Agents'
# parallel calls (several files read at once) stay well below it.
MAX_PARALLEL_CALLS = 16


def parameters_of(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters schema as sent; a function that declares none takes any object."""
    params = tool["function"].get("parameters")
    return params if isinstance(params, dict) and params else _ANY_OBJECT


def call_schema(tool: dict[str, Any], arguments_key: str = "arguments", at: str = "") -> dict[str, Any]:
    """The JSON schema of one call to `tool`: its name, and arguments matching its schema,
    narrowed as structured output is (router/generation/schema_rewrite.py). `at` is where this
    schema sits in the grammar's JSON document: the arguments' local `$ref`s are rewritten
    to point there."""
    try:
        arguments = relocated(narrowed(parameters_of(tool)), f"{at}/properties/{arguments_key}")
    except SchemaTooDeep as exc:
        name = tool["function"]["name"]
        raise InvalidRequest(f"Invalid 'tools': the parameters of {name!r}: {exc}.", "tools") from None
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool["function"]["name"]},
            arguments_key: arguments,
        },
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _lark_string(text: str) -> str:
    """`text` as a Lark string literal (JSON's escaping is a subset Lark reads)."""
    return json.dumps(text)


def _json(schema: dict[str, Any]) -> str:
    """A `%json` rule body, laid out as structured output is (JSON_LAYOUT): without it a
    grammar's JSON takes free whitespace, and a small model pads with newlines until
    max_tokens cuts the call."""
    return "%json " + json.dumps({"x-guidance": JSON_LAYOUT, **schema})


def _alternatives(tools: Sequence[dict[str, Any]], arguments_key: str) -> list[str]:
    """One rule per tool, each a JSON object that calls it, and the rule that picks one."""
    rules = [f"tool{i}: {_json(call_schema(t, arguments_key))}" for i, t in enumerate(tools)]
    rules.append("call_json: " + " | ".join(f"tool{i}" for i in range(len(tools))))
    return rules


def tool_choice_grammar(fmt: ToolFormat, tools: Sequence[dict[str, Any]], parallel: bool) -> str:
    """A Lark grammar whose every sentence is one call (or, with `parallel`, one or more
    calls) to one of `tools`, written as a model of format `fmt` writes calls."""
    if not tools:
        raise ValueError("a forced tool call needs at least one tool")
    more = f"{{0,{MAX_PARALLEL_CALLS - 1}}}"  # Lark's bounded repetition
    if fmt == "hermes":
        call = f"call: {_lark_string(HERMES_OPEN + chr(10))} call_json {_lark_string(chr(10) + HERMES_CLOSE)}"
        start = f'start: call ("\\n" call){more}' if parallel else "start: call"
        rules = [start, call, *_alternatives(tools, "arguments")]
    elif fmt == "llama3":
        # Llama 3.x writes exactly one call per turn.
        rules = ["start: call_json", *_alternatives(tools, "parameters")]
    elif fmt == "mistral":
        others = f' (", " call_json){more}' if parallel else ""
        rules = [f'start: {_lark_string(MISTRAL_PREFIX + "[")} call_json{others} "]"', *_alternatives(tools, "arguments")]
    else:
        at = "/properties/tool_calls/items"
        items: dict[str, Any] = (
            {"anyOf": [call_schema(t, at=f"{at}/anyOf/{i}") for i, t in enumerate(tools)]}
            if len(tools) > 1
            else call_schema(tools[0], at=at)
        )
        calls: dict[str, Any] = {
            "type": "array", "items": items, "minItems": 1, "maxItems": MAX_PARALLEL_CALLS if parallel else 1,
        }
        schema = {
            "type": "object",
            "properties": {"tool_calls": calls},
            "required": ["tool_calls"],
            "additionalProperties": False,
        }
        rules = [f"start: {_json(schema)}"]
    return "\n".join(rules) + "\n"


def tool_choice_constraint(fmt: ToolFormat, tools: Sequence[dict[str, Any]], parallel: bool) -> Constraint:
    return Constraint(kind="lark", source=tool_choice_grammar(fmt, tools, parallel), param="tool_choice")
