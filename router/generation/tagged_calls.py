"""Tool calls written as tags, each family's layout (router/generation/tool_blocks.py
sends each section here): XML functions (Qwen3-Coder, Seed-OSS), MiniMax's invokes (M2, and
M3's namespaced ones with nested values), DeepSeek V3.2's and V4's DSML, Kimi K3's,
GLM's key/value pairs (and Tencent Hy3's, suffixed `:opensource`), MiniCPM 5's.

A tagged VALUE is text; it is read as JSON where the function's schema says the parameter
is not a string (`types`), or, with no schema to go by, where it parses as JSON: `7` is the
number 7 for an integer parameter and stays "7" for a string one. Pure.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from router.generation.calls import Call
from router.server import json_text

# A function's parameters' JSON types, by function name then parameter name.
ParamTypes = Mapping[str, Mapping[str, str]]

_XML_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|$)", re.S)
_XML_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)
_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)(?:</invoke>|$)', re.S)
_INVOKE_PARAMETER = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.S)
_DSML_INVOKE = re.compile(r'<｜DSML｜invoke name="([^"]+)">(.*?)(?:</｜DSML｜invoke>|$)', re.S)
_DSML_PARAMETER = re.compile(r'<｜DSML｜parameter name="([^"]+)"(?: string="(true|false)")?>(.*?)</｜DSML｜parameter>', re.S)
_K3_CALL = re.compile(r'<\|open\|>call tool="([^"]+)"[^<]*?<\|sep\|>(.*?)(?:<\|close\|>call<\|sep\|>|$)', re.S)
_K3_ARGUMENT = re.compile(r'<\|open\|>argument key="([^"]+)"[^<]*?<\|sep\|>(.*?)<\|close\|>argument<\|sep\|>', re.S)
_CPM_PARAM = re.compile(r'<param name="([^"]+)">(.*?)</param>', re.S)
_CDATA = re.compile(r"^<!\[CDATA\[(.*)\]\]>$", re.S)
_HY_CALL = re.compile(r"<tool_call:opensource>\s*(.*?)\s*<tool_sep:opensource>(.*?)(?:</tool_call:opensource>|$)", re.S)
_HY_ARG = re.compile(r"<arg_key:opensource>(.*?)</arg_key:opensource>\s*<arg_value:opensource>(.*?)</arg_value:opensource>", re.S)
_M3_NS = "]<]minimax[>["
_M3_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)(?:</invoke>|$)', re.S)
_M3_CHILD = re.compile(r"<([A-Za-z_][\w.\-]*)>(.*?)</\1>", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _arguments(pairs: list[tuple[str, str]], name: str, types: ParamTypes) -> str:
    known = types.get(name, {})
    out: dict[str, Any] = {}
    for key, value in pairs:
        out[key.strip()] = typed_value(_trim(value), known.get(key.strip()))
    return json.dumps(out, ensure_ascii=False)


def _trim(value: str) -> str:
    """A tagged value without the one newline its template writes on each side."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def typed_value(text: str, json_type: str | None) -> Any:
    if json_type == "string":
        return text
    try:
        return json_text.loads(text)
    except ValueError:
        return text


def _tagged_calls(body: str, types: ParamTypes, call: re.Pattern[str], parameter: re.Pattern[str]) -> list[Call] | None:
    """Calls whose name and parameters are tags (`call` finds a call's name and insides,
    `parameter` each key and value in them)."""
    calls: list[Call] = []
    for m in call.finditer(body):
        name = m.group(1)
        pairs = [(p.group(1), p.group(2)) for p in parameter.finditer(m.group(2))]
        calls.append(Call(name=name, arguments=_arguments(pairs, name, types), raw=m.group(0)))
    return calls or None


def xml_functions(body: str, types: ParamTypes) -> list[Call] | None:
    return _tagged_calls(body, types, _XML_FUNCTION, _XML_PARAMETER)


def minimax_calls(body: str, types: ParamTypes) -> list[Call] | None:
    return _tagged_calls(body, types, _INVOKE, _INVOKE_PARAMETER)


def dsml_calls(body: str, types: ParamTypes) -> list[Call] | None:
    """DeepSeek V3.2's and V4's invokes: `string="true"` values are text, others JSON."""
    calls: list[Call] = []
    for m in _DSML_INVOKE.finditer(body):
        name, args = m.group(1), {}
        for key, is_string, value in _DSML_PARAMETER.findall(m.group(2)):
            args[key] = value if is_string == "true" else typed_value(value, types.get(name, {}).get(key))
        calls.append(Call(name=name, arguments=json.dumps(args, ensure_ascii=False), raw=m.group(0)))
    return calls or None


def kimi_k3_calls(body: str, types: ParamTypes) -> list[Call] | None:
    return _tagged_calls(body, types, _K3_CALL, _K3_ARGUMENT)


def minicpm5_calls(body: str, types: ParamTypes) -> list[Call] | None:
    """MiniCPM 5's `NAME"><param name="K">V</param>...` (between `<function name="` and
    `</function>`); a value may be wrapped in CDATA."""
    name, sep, rest = body.partition('">')
    if not sep or not re.fullmatch(r"[\w.\-:]+", name):
        return None
    pairs = [(k, m.group(1) if (m := _CDATA.match(v.strip())) else v) for k, v in _CPM_PARAM.findall(rest)]
    return [Call(name=name, arguments=_arguments(pairs, name, types), raw=body)]


def hy3_calls(body: str, types: ParamTypes) -> list[Call] | None:
    return _tagged_calls(body, types, _HY_CALL, _HY_ARG)


def minimax_m3_calls(body: str, types: ParamTypes) -> list[Call] | None:
    """MiniMax M3's invokes, its namespace marks taken out: `<KEY>VALUE</KEY>` children,
    nested ones for objects, `<item>` ones for arrays."""
    text = body.replace(_M3_NS, "")
    calls: list[Call] = []
    for m in _M3_INVOKE.finditer(text):
        name = m.group(1)
        known = types.get(name, {})
        args = {key: _m3_value(value, known.get(key)) for key, value in _M3_CHILD.findall(m.group(2))}
        calls.append(Call(name=name, arguments=json.dumps(args, ensure_ascii=False), raw=m.group(0)))
    return calls or None


# How deep MiniMax M3's nested tags are read as objects and lists; deeper, a value is kept
# as its text. Python's recursion would give out near 1,000 levels (a 500), and no real
# argument nests past a handful; the bound also keeps JSON-encoding the result shallow.
_M3_DEPTH = 64


def _m3_value(text: str, json_type: str | None, depth: int = 0) -> Any:
    children = _M3_CHILD.findall(text) if depth < _M3_DEPTH else []
    if not children:
        return typed_value(text.strip(), json_type)
    if all(key == "item" for key, _ in children):
        return [_m3_value(v, None, depth + 1) for _, v in children]
    return {key: _m3_value(v, None, depth + 1) for key, v in children}


def glm_call(body: str, types: ParamTypes) -> list[Call] | None:
    """GLM's one call: its name up to the first tag (or the end), then key/value pairs."""
    text = body.strip()
    cut = text.find("<arg_key>")
    name = (text if cut < 0 else text[:cut]).strip()
    if not name or not re.fullmatch(r"[\w.\-:]+", name):
        return None
    pairs = _GLM_ARG.findall(text[cut:]) if cut >= 0 else []
    return [Call(name=name, arguments=_arguments(pairs, name, types), raw=body)]


def tagged_hermes(body: str, types: ParamTypes) -> list[Call] | None:
    """A `<tool_call>` body that is not JSON: Qwen3-Coder's XML function, or GLM's."""
    if "<function=" in body:
        return xml_functions(body, types)
    return glm_call(body, types)
