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
from worker.chat_formats import BLOCKS, CALL_LAYOUTS, HERMES_CLOSE, HERMES_OPEN, MISTRAL_PREFIX
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


def arguments_schema(tool: dict[str, Any], at: str) -> dict[str, Any]:
    """A call's arguments' schema, narrowed, its `$ref`s pointing to `at`."""
    try:
        return relocated(narrowed(parameters_of(tool)), at)
    except SchemaTooDeep as exc:
        name = tool["function"]["name"]
        raise InvalidRequest(f"Invalid 'tools': the parameters of {name!r}: {exc}.", "tools") from None


def call_schema(
    tool: dict[str, Any], arguments_key: str = "arguments", at: str = "", name_key: str = "name"
) -> dict[str, Any]:
    """The JSON schema of one call to `tool`: its name, and arguments matching its schema,
    narrowed as structured output is (router/generation/schema_rewrite.py). `at` is where this
    schema sits in the grammar's JSON document: the arguments' local `$ref`s are rewritten
    to point there."""
    arguments = arguments_schema(tool, f"{at}/properties/{arguments_key}")
    return {
        "type": "object",
        "properties": {
            name_key: {"const": tool["function"]["name"]},
            arguments_key: arguments,
        },
        "required": [name_key, arguments_key],
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


def _alternatives(tools: Sequence[dict[str, Any]], arguments_key: str, name_key: str = "name") -> list[str]:
    """One rule per tool, each a JSON object that calls it, and the rule that picks one."""
    rules = [f"tool{i}: {_json(call_schema(t, arguments_key, name_key=name_key))}" for i, t in enumerate(tools)]
    rules.append("call_json: " + " | ".join(f"tool{i}" for i in range(len(tools))))
    return rules


def _native_alternatives(tools: Sequence[dict[str, Any]], layout: str) -> list[str]:
    """One rule per tool in a layout that writes the name as text and the arguments as
    JSON (`layout` holds NAME and ARGUMENTS, as chat_formats.CALL_LAYOUTS does)."""
    before, after = layout.split("ARGUMENTS")
    rules = []
    for i, t in enumerate(tools):
        head = before.replace("NAME", t["function"]["name"])
        tail = f" {_lark_string(after)}" if after else ""
        rules.append(f"tool{i}: {_lark_string(head)} {_json(arguments_schema(t, ''))}{tail}")
    rules.append("call_json: " + " | ".join(f"tool{i}" for i in range(len(tools))))
    return rules


# Block formats whose calls are written with the name as text (each call one rule, its
# own markers around it), and those whose section holds a JSON array of call objects.
_PER_CALL = {
    "deepseek_r1": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGUMENTS\n```<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"),
    "deepseek_v3_1": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"),
    "kimi_k2": ("<|tool_calls_section_begin|>", "<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>ARGUMENTS<|tool_call_end|>", "<|tool_calls_section_end|>"),
    "functionary_v3_1": ("", "<function=NAME>ARGUMENTS</function>", ""),
    "gemma4": ("", "<|tool_call>call:NAMEARGUMENTS<tool_call|>", ""),
}


def _sequence(opening: str, body: str, closing: str) -> str:
    """The start rule: `body` (Lark) between two literal markers, either of them empty."""
    parts = [_lark_string(opening)] if opening else []
    parts.append(body)
    if closing:
        parts.append(_lark_string(closing))
    return "start: " + " ".join(parts)


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
    elif fmt == "gpt_oss":
        # One call per turn, as GPT-OSS writes them (<|call|> then ends the generation).
        rules = ["start: call_json", *_native_alternatives(tools, CALL_LAYOUTS["gpt_oss"].replace("<|call|>", ""))]
    elif fmt == "muse_glimmer":
        # The prompt ends with "<|start|>assistant": the call's recipient header comes first.
        rules = ["start: call_json", *_native_alternatives(tools, " to=NAME<|message|><atem:function_calls>ARGUMENTS")]
    elif fmt == "functionary_v3_2":
        # The prompt ends with ">>>": the first call's name comes first, later ones after ">>>".
        more_calls = f' (">>>" call_json){more}' if parallel else ""
        rules = [f"start: call_json{more_calls}", *_native_alternatives(tools, "NAME\nARGUMENTS")]
    elif fmt in _PER_CALL:
        opening, layout, closing = _PER_CALL[fmt]
        repeated = f"call_json (call_json){more}" if parallel else "call_json"
        rules = [_sequence(opening, repeated, closing), *_native_alternatives(tools, layout)]
    elif fmt in BLOCKS:
        marker, end_marker = BLOCKS[fmt]
        # JSON arrays of calls for the array formats; a JSON call for the tagged ones
        # (their readers take JSON calls too: router/generation/tool_blocks.py).
        name_key, arguments_key = ("tool_name", "parameters") if fmt == "command_r7b" else ("name", "arguments")
        if fmt in ("seed_oss", "minimax_m2"):
            body = "\"\\n\" call_json \"\\n\""
        else:
            others = f' (", " call_json){more}' if parallel else ""
            body = f'"[" call_json{others} "]"'
        rules = [_sequence(marker, body, end_marker or ""), *_alternatives(tools, arguments_key, name_key)]
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
