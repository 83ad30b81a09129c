"""A config table checked key by key against its schema, every problem reported in English.

msgspec stops at the first bad value and speaks in types ("Expected `int | null`, got
`str`"). An operator fixing a file wants every problem at once, in words: `slots:
expected an integer, got "ten"`, and a suggestion for a misspelt key. So each key is
converted on its own, against its field's type, and the table is then built from the
keys that passed, which lets the semantic checks after it run on everything else.

Durations (fields typed `Seconds`) also take strings such as "10m" or "1h30m".
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from typing import Annotated, Any, TypeVar

import msgspec

from supervisor import msgspec_errors

# A field in seconds: a number, or a string with units ("500ms", "30s", "10m", "1h30m", "1d").
Seconds = Annotated[float, msgspec.Meta(extra={"unit": "seconds"})]

S = TypeVar("S", bound=msgspec.Struct)

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)\s*(ms|s|m|h|d))+")
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")


def parse_duration(text: str) -> float | None:
    """Seconds in "90s", "10m", "1h30m", "1.5h", "250ms", "2d"; None if it is not one."""
    t = text.strip().lower()
    if not t or not _DURATION.fullmatch(t):
        return None
    return sum(float(n) * _UNITS[u] for n, u in _PART.findall(t))


def suggestion(key: str, choices: typing.Iterable[str]) -> str:
    """" (did you mean port?)" for a close match, else ""."""
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def show(value: object) -> str:
    """A value as the file spells it, short: "ten", 5, true, a list, a table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 60 else text[:56] + '..."'
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # TOML's dates and times


_WORDS = {
    "int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
    "array": "a list", "object": "a table",
}
_EXPECTED = re.compile(r"Expected `(?P<want>[^`]+)`, got `[^`]+`")


def is_seconds(tp: object) -> bool:
    """Whether a field's type is Seconds or Seconds | None."""
    if typing.get_origin(tp) is Annotated:
        return any(isinstance(m, msgspec.Meta) and (m.extra or {}).get("unit") == "seconds" for m in tp.__metadata__)  # type: ignore[attr-defined]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(is_seconds(arg) for arg in typing.get_args(tp))
    return False


def _literal_choices(tp: object) -> list[object] | None:
    if typing.get_origin(tp) is typing.Literal:
        return list(typing.get_args(tp))
    for arg in typing.get_args(tp):
        if (choices := _literal_choices(arg)) is not None:
            return choices
    return None


def _at(value: object, path: str) -> object:
    """The part of `value` at msgspec's path ("[1].key"), for quoting it in a message."""
    for index, key in re.findall(r"\[(\d+)\]|\.?([^.\[\]]+)", path):
        try:
            value = value[int(index)] if index else value[key]  # type: ignore[index]
        except (LookupError, TypeError, ValueError):
            return None
    return value


def _sub(path: str) -> str:
    """A path inside a value, to follow its key: "[0].owner" or ".name"."""
    return "" if not path else path if path.startswith("[") else f".{path}"


def describe(exc: msgspec.ValidationError, value: object, tp: object) -> tuple[str, str]:
    """(where inside the value, English message) for a value that failed `tp`."""
    p = msgspec_errors.problem(exc)
    inner = _at(value, p.path)
    if p.unknown is not None or p.missing is not None:
        return _sub(p.key), "unknown key" if p.unknown is not None else "required key is missing"
    where = _sub(p.path)
    if p.message.startswith("Invalid enum value") and (choices := _literal_choices(tp)):
        options = ", ".join(json.dumps(c) for c in choices)
        return where, f"expected one of {options}, got {show(inner)}"
    if m := _EXPECTED.match(p.message):
        words = [_WORDS.get(w.strip(), w.strip()) for w in m.group("want").split("|") if w.strip() != "null"]
        want = " or ".join(dict.fromkeys(words))
        if is_seconds(tp) and not p.path:
            want = 'a number of seconds or a duration such as "10m"'
        return where, f"expected {want}, got {show(inner)}"
    return where, p.message[:1].lower() + p.message[1:]


def convert_table(raw: object, schema: type[S], at: str, problems: list[str]) -> S | None:
    """`raw` as a `schema` built from the keys that passed; every problem is appended to
    `problems` as `at.key: message`. None when the table cannot be built at all (it is
    not a table, or a required key is missing or wrong)."""
    if not isinstance(raw, dict):
        problems.append(f"{at}: expected a table, got {show(raw)}")
        return None
    fields = {f.encode_name: f for f in msgspec.structs.fields(schema)}
    good: dict[str, Any] = {}
    broken_required = False
    for key, value in raw.items():
        field = fields.get(key)
        if field is None:
            problems.append(f"{at}.{key}: unknown key{suggestion(key, fields)}")
            continue
        if isinstance(value, str) and is_seconds(field.type):
            seconds = parse_duration(value)
            if seconds is not None:
                value = seconds
        try:
            good[key] = msgspec.convert(value, field.type)
        except msgspec.ValidationError as exc:
            where, message = describe(exc, value, field.type)
            problems.append(f"{at}.{key}{where}: {message}")
            broken_required |= field.required
    missing = [name for name, f in fields.items() if f.required and name not in raw]
    for name in missing:
        problems.append(f"{at}.{name}: required key is missing")
    if missing or broken_required:
        return None
    return schema(**good)  # every value is converted already
