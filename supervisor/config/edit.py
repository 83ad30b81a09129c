"""Edits of a config file's text that keep everything else byte for byte (tomlkit).

Each function takes the file's text and returns the new text; none reads or writes a file
and none validates the result as a whole (the caller runs the same checks as `serve`,
supervisor.config.from_bytes, on the new text). tomlkit keeps comments, order, blank lines
and quoting; only the edited table changes, and within it only the edited line.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Mapping, Sequence

import tomlkit
from tomlkit.container import Container
from tomlkit.exceptions import ParseError
from tomlkit.items import InlineTable, Item, Table
from tomlkit.toml_document import TOMLDocument

from supervisor.config.key_paths import EditError, KeyPath, quote, resolve, typed_value, is_required


def _parse(text: str) -> TOMLDocument:
    try:
        return tomlkit.parse(text)
    except ParseError as exc:
        raise EditError(f"(syntax): {exc}; fix the file by hand first") from None


def _newlines_of(text: str, out: str) -> str:
    """`out` with the line endings of `text`: tomlkit writes the lines it adds with "\n",
    which in a CRLF file (one kept on Windows) would leave it with both."""
    if "\r\n" in text and not re.search(r"(?<!\r)\n", text):
        return re.sub(r"(?<!\r)\n", "\r\n", out)
    return out


def _models(doc: TOMLDocument) -> list[str]:
    models = doc.get("models")
    return list(models) if isinstance(models, (Table, InlineTable, dict)) else []


def _model_table(doc: TOMLDocument, name: str) -> Table | InlineTable:
    names = _models(doc)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean {quote(close[0])}?" if close else ""
        listed = ", ".join(quote(n) for n in names) or "none"
        raise EditError(f"models.{quote(name)}: no such model (models: {listed}){hint}")
    table = doc["models"][name]
    if not isinstance(table, (Table, InlineTable)):
        # Keys spread as `name.key = ...` lines (tomlkit's out-of-order proxy): tomlkit
        # would rewrite their order, so this is left to a person.
        raise EditError(
            f"models.{quote(name)}: written as dotted keys ({quote(name)}.path = ...), which "
            f"this command does not edit; write it as a [models.{quote(name)}] table"
        )
    return table


def _table(doc: TOMLDocument, path: KeyPath, create: bool) -> Table | InlineTable | None:
    """The table that holds `path`'s key; a missing [server] or [supervisor] is made when
    `create`, at the end of the file."""
    if path.model is not None:
        return _model_table(doc, path.model)
    table = doc.get(path.section)
    if table is None:
        if not create:
            return None
        table = tomlkit.table()
        _separate(doc)
        doc.add(path.section, table)
        return doc[path.section]  # type: ignore[no-any-return]
    if not isinstance(table, (Table, InlineTable)):
        raise EditError(f"{path.section}: not a table")
    return table


def _separate(doc: TOMLDocument) -> None:
    """A blank line before a table added at the end, as a person would leave one."""
    text = doc.as_string()
    if text and not text.endswith("\n\n"):
        doc.add(tomlkit.nl())


def to_item(value: Any) -> Item:
    """A TOML item for a typed value: tables inside arrays stay inline (`api_keys = [{ key
    = "..." }]`) rather than becoming [[arrays of tables]] elsewhere in the file."""
    if isinstance(value, list):
        array = tomlkit.array()
        for v in value:
            array.append(_inline(v) if isinstance(v, dict) else v)
        return array
    if isinstance(value, dict):
        return _inline(value)
    item: Item = tomlkit.item(value)
    return item


def _inline(value: Mapping[str, Any]) -> InlineTable:
    table = tomlkit.inline_table()
    for k, v in value.items():
        table[k] = to_item(v)
    return table


def _put(table: Table | InlineTable, key: str, item: Item) -> None:
    """Set `key`: in place where it is (its trailing comment kept), else after the table's
    last key, so that it lands before the comments and blank lines that lead into the next
    table rather than after them."""
    if key in table or isinstance(table, InlineTable):
        table[key] = item
        return
    body: Container = table.value
    last = [k for k, _ in body.body if k is not None]
    if not last:
        table[key] = item
        return
    # tomlkit has no public "insert after"; Container._insert_after is what Table.add uses
    # for dotted keys, and keeps the whitespace that follows `last`.
    body._insert_after(last[-1], key, item)


def set_key(text: str, key: str, words: Sequence[str]) -> str:
    """The text with `key` (a dotted path) set to `words`, typed by the schema. Raises
    EditError naming the key path."""
    doc = _parse(text)
    path = resolve(key, _models(doc))
    value = typed_value(path, words)
    table = _table(doc, path, create=True)
    assert table is not None
    _put(table, path.key, to_item(value))
    return _newlines_of(text, doc.as_string())


def unset_key(text: str, key: str) -> tuple[str, bool]:
    """The text without `key`, so that its default applies, and whether it was set at all.
    Raises EditError for a required key or an unknown one."""
    doc = _parse(text)
    path = resolve(key, _models(doc))
    table = _table(doc, path, create=False)
    # A model's path is required unless the model is served elsewhere (its `upstream`).
    if is_required(path) or (path.section == "models" and path.key == "path" and "upstream" not in (table or {})):
        raise EditError(f"{path}: required, cannot be unset (remove the model with remove-model)")
    if table is None or path.key not in table:
        return text, False
    del table[path.key]
    return _newlines_of(text, doc.as_string()), True


def add_model(text: str, name: str, fields: Mapping[str, Sequence[str]]) -> str:
    """The text with a new `[models.NAME]` table at the end, its keys typed as `set` types
    them (`fields` maps a key to its words; "path" is required). Raises EditError if the
    model exists or a key is unknown or mistyped."""
    doc = _parse(text)
    if not name.strip():
        raise EditError("models: a model name must not be empty")
    if name in _models(doc):
        raise EditError(f"models.{quote(name)}: already exists (set its keys with `config set`)")
    if "path" not in fields and "upstream" not in fields:
        raise EditError(f"models.{quote(name)}.path: required key is missing (or give `upstream`)")
    table = tomlkit.table()
    for key, words in fields.items():
        path = resolve(f"models.{quote(name)}.{quote(key)}", [name])
        table.add(key, to_item(typed_value(path, words)))
    models = doc.get("models")
    if models is None:
        _separate(doc)
        doc.add("models", tomlkit.table(is_super_table=True))
        models = doc["models"]
    elif not isinstance(models, (Table, InlineTable)):
        raise EditError("models: not a table")
    if isinstance(models, InlineTable):
        models[name] = _inline({k: v for k, v in table.items()})
    else:
        models.add(name, table)
    return _newlines_of(text, doc.as_string())


def remove_model(text: str, name: str) -> str:
    """The text without the model's table. Raises EditError naming the model if there is
    none (with the closest name)."""
    doc = _parse(text)
    _model_table(doc, name)
    at_end = _models(doc)[-1] == name and [k for k, _ in doc.body if k is not None][-1] == "models"
    del doc["models"][name]
    out = _newlines_of(text, doc.as_string())
    for blank in ("\r\n\r\n", "\n\n"):
        if at_end and out.endswith(blank):
            # The blank line that separated the removed table (as add-model leaves one)
            # goes with it, so that add-model then remove-model gives back the same bytes.
            out = out[: -len(blank) // 2]
            break
    return out
