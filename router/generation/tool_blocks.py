"""The insides of tool-call sections, in each model family's own layout (the formats of
worker/chat_formats.py whose calls sit between markers). Given a section's text between
its markers, `calls_in` gives the calls it holds, or None when it holds none that parse
(the section is then content, as llama.cpp treats text that does not parse).

Layouts, as llama.cpp's common/chat.cpp and its tests (tests/test-chat.cpp) read them:
- JSON: an object `{"name", "arguments"}`, an array of them, or objects one per line
  (Hermes, Nemotron v2, Apriel, MiniMax M1, FireFunction v2), with Command R7B's names
  `tool_name`/`parameters`/`tool_call_id`.
- DeepSeek R1: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>`
  per call; V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`.
- Kimi K2: `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>`.
- Functionary v3.1: `<function=NAME>ARGS</function>`, the section's markers being the
  call's own.
- LFM2: Python calls, `[NAME(key="v", n=1), ...]`.
- Gemma 4: `call:NAME{key:<|"|>text<|"|>,n:42}`, bare keys and `<|"|>` for quotes.
- Apertus: a JSON array of `{NAME: ARGUMENTS}`.
- GigaChat 3 and 3.1, Command R+: a JSON call (or array) after their markers.
- Layouts of tags (XML functions, invokes, DSML, GLM's and Hy3's key/value pairs, Kimi
  K3's, MiniCPM 5's): router/generation/tagged_calls.py, whose values are read by the
  declared parameter types. Pure.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from router.generation.calls import Call, JsonScanner, call_from, json_end
from router.generation.tagged_calls import (
    ParamTypes,
    dsml_calls,
    hy3_calls,
    kimi_k3_calls,
    minicpm5_calls,
    minimax_calls,
    minimax_m3_calls,
    xml_functions,
)
from router.server import json_text


_DS_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)(?:<｜tool▁call▁end｜>|$)", re.S)
_KIMI_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*(?:functions\.)?([^\s:<]+)(?::(\d+))?\s*<\|tool_call_argument_begin\|>(.*?)(?:<\|tool_call_end\|>|$)",
    re.S,
)
_FENCED = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


def calls_in(fmt: str, body: str, types: ParamTypes | None = None) -> list[Call] | None:
    """The calls of one section's text (between its markers), or None."""
    reader = _READERS.get(fmt)
    calls = reader(body, types or {}) if reader is not None else None
    if calls is None and fmt != "functionary_v3_1":
        calls = json_calls(body)  # every section also takes plain JSON calls (a forced call's)
    return calls or None


# Where each call of a per-call layout ends: a section still open holds whole calls up to
# the last of these.
_CALL_ENDS = {
    "deepseek_r1": "<｜tool▁call▁end｜>",
    "deepseek_v3_1": "<｜tool▁call▁end｜>",
    "kimi_k2": "<|tool_call_end|>",
    "seed_oss": "</function>",
    "minimax_m2": "</invoke>",
    "minimax_m3": "</invoke>",
    "hy3": "</tool_call:opensource>",
}


def whole_part(fmt: str, body: str, scanner: JsonScanner | None = None) -> str:
    """The part of a section still being written that holds only whole calls (as a
    section of its own: an open JSON array is closed after its last whole object)."""
    end = _CALL_ENDS.get(fmt)
    if end is not None:
        at = body.rfind(end)
        return body[: at + len(end)] if at >= 0 else ""
    text = body.lstrip()
    if not text.startswith("["):
        return ""
    scan = scanner if scanner is not None else JsonScanner()
    scan.end(text)
    last = scan.items[-1] if scan.items else 0
    return text[:last] + "]" if last else ""


def json_calls(body: str) -> list[Call] | None:
    """An object, an array of objects, or objects one after another, each a call."""
    text = body.strip()
    values: list[Any] = []
    while text:
        if text[0] not in "[{":
            return None
        end = json_end(text)
        if end is None:
            return None
        try:
            value = json_text.loads(text[:end])
        except ValueError:
            return None
        values.extend(value if isinstance(value, list) else [value])
        text = text[end:].lstrip().lstrip(",").lstrip()
    calls = [_call_of(v, body if len(values) == 1 else json.dumps(v, ensure_ascii=False)) for v in values]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _call_of(value: Any, raw: str) -> Call | None:
    """A call from a JSON object, in OpenAI's names or Command R's."""
    if isinstance(value, dict) and "tool_name" in value:
        own = value.get("tool_call_id")
        value = {"name": value["tool_name"], "arguments": value.get("parameters", {}), "id": None if own is None else str(own)}
    return call_from(value, raw)


def _deepseek(body: str, typed: bool) -> list[Call] | None:
    """DeepSeek's calls: `TYPE<｜tool▁sep｜>NAME\n```json ARGS```` (R1, `typed`) or
    `NAME<｜tool▁sep｜>ARGS` (V3.1), each between `<｜tool▁call▁begin｜>` and its end."""
    calls: list[Call] = []
    for m in _DS_CALL.finditer(body):
        head, sep, rest = m.group(1).partition("<｜tool▁sep｜>")
        if not sep:
            return None
        name, args = rest.partition("\n")[::2] if typed else (head, rest)
        fenced = _FENCED.match(args)
        call = call_from({"name": name.strip(), "arguments": (fenced.group(1) if fenced else args).strip()}, m.group(0))
        if call is None or not _is_json(call.arguments):
            return None
        calls.append(call)
    return calls or None


def _deepseek_r1(body: str, types: ParamTypes) -> list[Call] | None:
    return _deepseek(body, typed=True)


def _deepseek_v3_1(body: str, types: ParamTypes) -> list[Call] | None:
    return _deepseek(body, typed=False)


def _kimi(body: str, types: ParamTypes) -> list[Call] | None:
    calls: list[Call] = []
    for m in _KIMI_CALL.finditer(body):
        name, index, args = m.group(1), m.group(2), m.group(3).strip()
        own = f"functions.{name}:{index}" if index is not None else None
        call = call_from({"name": name, "arguments": args, "id": own}, m.group(0))
        if call is None or not _is_json(call.arguments):
            return None
        calls.append(call)
    return calls or None


def _functionary(body: str, types: ParamTypes) -> list[Call] | None:
    """Between `<function=` and `</function>`: `NAME>ARGS`."""
    name, sep, args = body.partition(">")
    if not sep or not name.strip():
        return None
    call = call_from({"name": name.strip(), "arguments": args.strip() or "{}"}, body)
    return [call] if call is not None and _is_json(call.arguments) else None


def _pythonic(body: str, types: ParamTypes) -> list[Call] | None:
    """LFM2's `[f(a=1, b="x"), g()]`: Python syntax, read by Python's parser, never run."""
    try:
        tree = ast.parse(body.strip(), mode="eval").body
    except SyntaxError:
        return None
    calls: list[Call] = []
    for node in tree.elts if isinstance(tree, ast.List) else [tree]:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = ast.unparse(node.func)
        if not re.fullmatch(r"[A-Za-z_][\w.]*", name):  # a dotted name, nothing computed
            return None
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                return None
            try:
                args[kw.arg] = _literal(kw.value)
            except ValueError:
                return None
        calls.append(Call(name=name, arguments=json.dumps(args, ensure_ascii=False), raw=ast.unparse(node)))
    return calls or None


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _literal(node: ast.expr) -> Any:
    """A Python literal, JSON's true/false/null taken too."""
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k) if k is not None else None: _literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


_GEMMA_QUOTE = '<|"|>'
_BARE_KEY = re.compile(r'([{,]\s*)([A-Za-z_][\w\-]*)\s*:')


def _gemma4(body: str, types: ParamTypes) -> list[Call] | None:
    """Gemma 4's `call:NAME{key:<|"|>text<|"|>,n:42}`: its quotes made JSON's, keys quoted."""
    text = body.strip()
    if not text.startswith("call:") or "{" not in text:
        return None
    name, brace, rest = text[len("call:") :].partition("{")
    parts = (brace + rest).split(_GEMMA_QUOTE)
    if len(parts) % 2 == 0:
        return None  # an unclosed string
    out = "".join(json.dumps(p) if i % 2 else _BARE_KEY.sub(r'\1"\2":', p) for i, p in enumerate(parts))
    try:
        args = json_text.loads(out)
    except ValueError:
        return None
    call = call_from({"name": name.strip(), "arguments": args}, body)
    return [call] if call is not None else None


def _apertus(body: str, types: ParamTypes) -> list[Call] | None:
    """Apertus' `[{"NAME": {ARGS}}]`: each object's one key is the function."""
    try:
        values = json_text.loads(body)
    except ValueError:
        return None
    calls: list[Call] = []
    for v in values if isinstance(values, list) else [values]:
        if not isinstance(v, dict) or len(v) != 1:
            return None
        (name, args), = v.items()
        call = call_from({"name": name, "arguments": args}, json.dumps(v, ensure_ascii=False))
        if call is None:
            return None
        calls.append(call)
    return calls or None


def _is_json(text: str) -> bool:
    try:
        json_text.loads(text)
        return True
    except ValueError:
        return False


_READERS = {
    "deepseek_r1": _deepseek_r1,
    "deepseek_v3_1": _deepseek_v3_1,
    "kimi_k2": _kimi,
    "seed_oss": xml_functions,
    "minimax_m2": minimax_calls,
    "functionary_v3_1": _functionary,
    "lfm2": _pythonic,
    "gemma4": _gemma4,
    "apertus": _apertus,
    "deepseek_v3_2": dsml_calls,
    "deepseek_v4": dsml_calls,
    "kimi_k3": kimi_k3_calls,
    "minicpm5": minicpm5_calls,
    "hy3": hy3_calls,
    "minimax_m3": minimax_m3_calls,
}
