"""`corral config show`: the config as the server runs it, every default filled in, with
every secret masked.

Built from the validated Config (the resolved ModelSpec, not the file's ModelConfig): a
model's idle_timeout is the one that applies, paths are absolute. Keys never appear:
strings in api_keys and admin_keys, and the `key` of an api_keys table, become "***";
keys from api_keys_file and CORRAL_API_KEYS are not part of the config and are only
counted. Pure.
"""

from __future__ import annotations

from typing import Any

import msgspec
import tomlkit

from supervisor.config.key_paths import SECRET_FIELDS
from supervisor.config.schema import UPSTREAM_KEYS, Config

MASK = "***"


def effective(cfg: Config) -> dict[str, Any]:
    """The config as plain data (None where a key is unset), secrets masked."""
    models: dict[str, dict[str, Any]] = {}
    for name, spec in cfg.models.items():
        table = msgspec.to_builtins(spec, enc_hook=str)  # paths as text
        del table["name"]  # the table's own name
        models[name] = table
    for name, up in cfg.upstreams.items():
        table = models.setdefault(name, {"path": None, "aliases": list(up.aliases), "tags": list(up.tags)})
        table.update(
            upstream=list(up.urls), upstream_model=up.model, api_key_env=up.api_key_env,
            api_key_file=up.api_key_file, timeout=up.timeout, max_concurrency=up.max_concurrency,
            upstream_dialects=sorted(up.dialects), upstream_cache_salt=up.cache_salt,
        )
    for name, view in cfg.lora.items():
        # A name's own adapters, as its table lists them (a base model's worker loads its
        # adapter models' too: supervisor/config/lora.py); an adapter model's table whole.
        own = [{"path": str(a.path), "scale": a.scale} for a in view.adapters]
        if view.adapter_model:
            models[name] = {"path": None, "base": view.model, "lora": own, "aliases": list(view.aliases), "tags": list(view.tags)}
        elif name in models:
            models[name]["lora"] = own
    for table in models.values():  # a model served here only: its upstream keys, unset
        for key in (*UPSTREAM_KEYS, "base"):
            table.setdefault(key, None)
    data: dict[str, Any] = {
        "server": msgspec.to_builtins(cfg.server),
        "supervisor": msgspec.to_builtins(cfg.supervisor),
        "models": models,
    }
    masked = mask(data)
    assert isinstance(masked, dict)
    return masked


def mask(value: Any, secret: bool = False) -> Any:
    """`value` with every string of a secret field (or of a list under one) replaced by
    MASK. A table inside a secret list starts afresh: of an api_keys table, only its `key`
    is secret, and its name and models stay readable."""
    if isinstance(value, dict):
        return {k: mask(v, k in SECRET_FIELDS) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v, secret) for v in value]
    if secret and isinstance(value, str):
        return MASK
    return value


def to_toml(data: dict[str, Any]) -> str:
    """TOML for `effective()`'s data: a key that is unset (None, which TOML cannot hold) is
    written as a comment, so that every key of the schema is listed."""
    doc = tomlkit.document()
    for section in ("server", "supervisor"):
        doc.add(section, _table(data[section]))
    models = tomlkit.table(is_super_table=True)
    for name, fields in data["models"].items():
        models.add(name, _table(fields))
    doc.add("models", models)
    return doc.as_string()


def _table(fields: dict[str, Any]) -> Any:
    table = tomlkit.table()
    for key, value in fields.items():
        if value is None:
            table.add(tomlkit.comment(f"{key}: not set"))
        elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
            array = tomlkit.array()
            for v in value:
                if isinstance(v, dict):
                    inline = tomlkit.inline_table()
                    inline.update({k: x for k, x in v.items() if x is not None})
                    array.append(inline)
                else:
                    array.append(v)
            table.add(key, array)
        else:
            table.add(key, value)
    return table
