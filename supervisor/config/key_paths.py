"""Key paths of the config file (`models."qwen2.5".slots`) and values typed by its schema.

`corral config set/unset` name a key as a dotted path, with TOML's quoting for a model
name that holds dots or other odd characters. This module knows which paths exist (from
the msgspec Structs of supervisor/config/schema.py, so a new option needs no change here) and
turns the operator's words into a value of the key's type. Pure: no file, no tomlkit.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Sequence, get_args, get_origin

import msgspec

from supervisor.config.convert import is_seconds, parse_duration
from supervisor.config.keys import ApiKeyTable
from supervisor.config.schema import ModelConfig, ServerConfig, SupervisorConfig


class EditError(Exception):
    """A key path or value that cannot be used; the message names the key path."""


# Sections and the Struct that types their keys; [models.NAME] tables are ModelConfig.
SECTIONS: dict[str, type[msgspec.Struct]] = {"server": ServerConfig, "supervisor": SupervisorConfig}
# Fields whose values are secrets wherever they appear (an api_keys table's `key` too): no
# message quotes them, and `config show` masks them.
SECRET_FIELDS = frozenset({"api_keys", "admin_keys", "key"})
_BARE = re.compile(r"[A-Za-z0-9_-]+")
# A whole dotted key, as TOML spells one: bare parts, "basic" and 'literal' strings. Checked
# before tomllib reads it, so that `server.port = 1 #` or a newline cannot smuggle a
# value or a second key through the parse below.
_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\\x00-\x1f\x7f]|\\.)*"|'[^'\x00-\x08\x0a-\x1f\x7f]*')"""
_DOTTED = re.compile(rf"[ \t]*{_PART}(?:[ \t]*\.[ \t]*{_PART})*[ \t]*")


@dataclass(frozen=True)
class KeyPath:
    """A key of the file: `section` ("server", "supervisor" or "models"), the model's name
    for a models key, and the key within the table."""

    section: str
    key: str
    model: str | None = None

    @property
    def table(self) -> tuple[str, ...]:
        """The path of the table that holds the key."""
        return (self.section,) if self.model is None else (self.section, self.model)

    def __str__(self) -> str:
        return ".".join(quote(part) for part in (*self.table, self.key))


def quote(part: str) -> str:
    """A key as TOML writes it: bare where it can be, else a basic string."""
    return part if _BARE.fullmatch(part) else json.dumps(part, ensure_ascii=False)


def split(text: str) -> list[str]:
    """`models."qwen2.5".slots` -> ["models", "qwen2.5", "slots"]; TOML's own rules for a
    dotted key (bare parts, "basic" and 'literal' strings), read by tomllib itself so that
    quoting means exactly what it means in the file. Raises EditError."""
    if not text.strip():
        raise EditError("(key): the key path is empty")
    hint = 'quote a part that holds dots or spaces: models."qwen2.5".slots'
    if not _DOTTED.fullmatch(text):
        raise EditError(f"{text!r}: not a key path; {hint}")
    try:
        # A dotted key on the left of `=` builds nested tables: walk them back down.
        tree: Any = tomllib.loads(f"{text} = 0")
    except tomllib.TOMLDecodeError as exc:
        raise EditError(f"{text!r}: not a key path ({exc}); {hint}") from None
    parts: list[str] = []
    while isinstance(tree, dict):
        (name, tree), = tree.items()
        parts.append(name)
    return parts


def _keys_of(struct: type[msgspec.Struct]) -> list[str]:
    return [f.name for f in msgspec.structs.fields(struct)]


def _unknown(path: str, choices: Sequence[str]) -> EditError:
    close = difflib.get_close_matches(path, choices, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return EditError(f"{path}: unknown key{hint}")


def resolve(text: str, models: Sequence[str] = ()) -> KeyPath:
    """The key a path names, checked against the schema; `models` are the file's model
    names, for suggestions. Raises EditError naming the path, with the nearest known key."""
    parts = split(text)
    section = parts[0]
    if section in (*SECTIONS, "models") and len(parts) == 1:
        raise EditError(f"{section}: a section, not a key; name one of its keys ({_example(section)})")
    if section in SECTIONS:
        known = _keys_of(SECTIONS[section])
        if len(parts) != 2 or parts[1] not in known:
            raise _unknown(".".join(map(quote, parts)), [f"{section}.{k}" for k in known])
        return KeyPath(section, parts[1])
    if section == "models":
        if len(parts) == 2:
            raise EditError(
                f"{text}: a whole model is not one value; use add-model or remove-model, "
                f"or name one of its keys ({'.'.join(map(quote, parts))}.slots)"
            )
        if len(parts) != 3:
            name = ".".join(parts[1:-1])
            raise EditError(
                f"{text}: expected models.NAME.KEY; quote a name that holds dots: "
                f"models.{json.dumps(name)}.{quote(parts[-1])}"
            )
        known = _keys_of(ModelConfig)
        if parts[2] not in known:
            raise _unknown(".".join(map(quote, parts)), [f"models.{quote(parts[1])}.{k}" for k in known])
        return KeyPath("models", parts[2], parts[1])
    choices = [*SECTIONS, "models", *(f"{s}.{k}" for s, t in SECTIONS.items() for k in _keys_of(t))]
    choices += [f"models.{quote(m)}" for m in models]
    raise _unknown(".".join(map(quote, parts)), choices)


def _example(section: str) -> str:
    return {"server": "server.port", "supervisor": "supervisor.idle_timeout"}.get(section, "models.NAME.slots")


def field_type(path: KeyPath) -> Any:
    struct = ModelConfig if path.section == "models" else SECTIONS[path.section]
    for f in msgspec.structs.fields(struct):
        if f.name == path.key:
            return f.type
    raise AssertionError(f"{path}: resolve() let an unknown key through")


def is_required(path: KeyPath) -> bool:
    struct = ModelConfig if path.section == "models" else SECTIONS[path.section]
    return any(f.name == path.key and f.required for f in msgspec.structs.fields(struct))


def _is_list(tp: Any) -> bool:
    return get_origin(tp) is list or any(get_origin(a) is list for a in get_args(tp))


def _candidates(word: str) -> list[Any]:
    """What one word on the command line may mean, most literal reading last: a TOML value
    (8, 2.5, true, [..], {..}, "quoted"), a JSON value, or the word as a string."""
    out: list[Any] = []
    try:
        out.append(tomllib.loads(f"v = {word}")["v"])
    except (tomllib.TOMLDecodeError, RecursionError):
        pass
    try:
        out.append(json.loads(word))
    except (ValueError, RecursionError):
        pass
    out.append(word)
    return out


def typed_value(path: KeyPath, words: Sequence[str]) -> Any:
    """The value to write for `words` (one or more command-line words): the first reading
    the key's type accepts, as a plain TOML-writable value (an int written to a float key
    becomes a float). Several words make a list, for a list key only. Raises EditError
    naming the key and what it expects."""
    tp = field_type(path)
    if not words:
        raise EditError(f"{path}: no value given")
    if len(words) > 1:
        if not _is_list(tp):
            raise EditError(f"{path}: takes one value, got {len(words)}")
        items = [_item(path, w, tp) for w in words]
        return _checked(path, items, tp)
    for value in _candidates(words[0]):
        if value is None:  # TOML has no null; unset is how a key goes back to None
            continue
        try:
            return _checked(path, value, tp)
        except msgspec.ValidationError:
            continue
    if _is_list(tp) and not any(isinstance(v, list) for v in _candidates(words[0])):
        # One bare word for a list key: a list of one. A word that reads as a list but
        # not as this list ([1] for aliases) is a mistake, not a name.
        return _checked(path, [_item(path, words[0], tp)], tp)
    got = "a value that is not shown" if path.key in SECRET_FIELDS else repr(words[0])
    raise EditError(f"{path}: expected {_type_name(tp)}, got {got}")


def _item(path: KeyPath, word: str, list_type: Any) -> Any:
    """One of several words given for a list key: the reading its element type accepts."""
    elem = next(get_args(a)[0] for a in (list_type, *get_args(list_type)) if get_origin(a) is list)
    for value in _candidates(word):
        if value is None:
            continue
        try:
            msgspec.convert(value, elem)
            return value
        except msgspec.ValidationError:
            continue
    got = "a value that is not shown" if path.key in SECRET_FIELDS else repr(word)
    raise EditError(f"{path}: {got} is not a {_type_name(elem)}")


def _checked(path: KeyPath, value: Any, tp: Any) -> Any:
    """`value` if the type takes it, as TOML will hold it. Raises ValidationError."""
    if isinstance(value, str) and is_seconds(tp) and parse_duration(value) is not None:
        return value  # "10m" stays as written: the loader reads it as 600 seconds
    converted = msgspec.convert(value, tp)
    if isinstance(converted, float) and not isinstance(value, float):
        return converted  # 30 for a float key: written as 30.0, which reads back as a float
    return value


def _type_name(tp: Any) -> str:
    """A type as the operator reads it: int, a list of str, one of "text", "json", ..."""
    args = get_args(tp)
    if get_origin(tp) is Annotated:
        return 'a number of seconds or a duration such as "10m"' if is_seconds(tp) else _type_name(args[0])
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(json.dumps(a) for a in args)
    if get_origin(tp) is list:
        return f"a list of {_type_name(args[0])} (e.g. [\"a\", \"b\"], or one word per item)"
    if args:  # a union; None is what unset is for
        return " or ".join(_type_name(a) for a in args if a is not type(None))
    if tp is ApiKeyTable:
        return '{ key = "...", name = "...", models = [...] }'
    return getattr(tp, "__name__", str(tp))
