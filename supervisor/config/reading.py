"""Reading a config: TOML text to a checked `Config`, every problem reported at once.

Parsing is stdlib `tomllib`; each key is then type-checked on its own
(supervisor/config/convert.py) and the whole checked (supervisor/config/checks.py), and
every error is reported as `key.path: what is wrong`. A model file that cannot load is the
exception: it is reported the same way but in `Config.unloadable`, so that one bad download
fails that model alone (supervisor/model_loop.py) while `config check` still refuses it.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from typing import Any
from pathlib import Path

from msgspec.structs import replace

from supervisor.config import gguf_meta, keys, lora, models_dir, upstreams
from supervisor.config.checks import check, resolve_path
from supervisor.config.convert import convert_table, show, suggestion
from supervisor.config.key_paths import quote
from supervisor.config.keys import KeyFileError, Keyring, KeySource
from supervisor.config.schema import (
    Config,
    GenerationDefaults,
    ConfigError,
    ConfigFile,
    ModelConfig,
    ModelSpec,
    ServerConfig,
    SupervisorConfig,
    UPSTREAM_KEYS,
)
from supervisor.config.templates import BUILTIN_CHAT_TEMPLATES
from worker.protocol import ModelOptions, options_of


def parse(
    text: str,
    base_dir: Path,
    source: str = "",
    api_keys_env: str | None = None,
    server_overrides: dict[str, object] | None = None,
) -> Config:
    """Parse and validate config text; `api_keys_env` is CORRAL_API_KEYS' value, and
    `server_overrides` are [server] keys from the command line (`with_server`). Their
    models_dir applies before the check, since it decides which models there are; the
    others after it, so that a bad --port is not blamed on the file. Raises ConfigError
    naming every problem found."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"(syntax): {exc}"], source) from exc
    except RecursionError as exc:  # tomllib recurses per nesting level
        raise ConfigError(["(syntax): arrays or tables nested too deeply"], source) from exc
    overrides = dict(server_overrides or {})
    if "models_dir" in overrides and isinstance(server := raw.setdefault("server", {}), dict):
        server["models_dir"] = overrides.pop("models_dir")
    # The models of [server] models_dir and the [model_defaults] become plain tables
    # before the type check, which then treats them as written ones.
    early = models_dir.add_tables(raw, base_dir) + _apply_model_defaults(raw)
    file, broken, problems = _convert(raw)
    problems = early + problems + list(check(file, base_dir, broken))
    for name, m in file.models.items():
        if m.base is None:
            problems += upstreams.problems(f"models.{quote(name)}", m, base_dir, os.environ)
        problems += lora.table_problems(f"models.{quote(name)}", m, file.models, base_dir)
    problems += upstreams.fleet_problems(file.server, base_dir, os.environ)
    keyring, key_problems = _keys(file, base_dir, api_keys_env)
    problems += key_problems
    # A file that is not a GGUF model, or was cut short, would fail every load.
    unloadable = {
        name: f"models.{quote(name)}.path: {why}"
        for name, m in file.models.items()
        if m.path is not None and (why := gguf_meta.problem(resolve_path(m.path, base_dir))) is not None
    }
    if problems:  # refused anyway: every problem in one go
        raise ConfigError(problems + list(unloadable.values()), source)
    default_idle = file.supervisor.idle_timeout
    loads, views = lora.plan(file.models, base_dir)
    models = {
        name: ModelSpec(
            name=name,
            path=resolve_path(m.path, base_dir),  # (only tables with a path)
            aliases=tuple(m.aliases),
            tags=tuple(m.tags),
            idle_timeout=default_idle if m.idle_timeout is None else m.idle_timeout,
            preload=m.preload,
            pinned=m.pinned,
            instances=m.instances,
            max_queue=m.max_queue,
            queue_timeout=m.queue_timeout,
            **generation_defaults(m),
            # The worker's options pass as written, except paths (a template file, the prompt
            # cache's folder): they are relative to the config file, which the worker knows
            # nothing of.
            **options_of(
                replace(
                    m,
                    chat_template=_template(m.chat_template, base_dir),
                    prompt_cache_dir=None if m.prompt_cache_dir is None else str(resolve_path(m.prompt_cache_dir, base_dir)),
                    draft_model=None if m.draft_model is None else str(resolve_path(m.draft_model, base_dir)),
                    mmproj=None if m.mmproj is None else str(resolve_path(m.mmproj, base_dir)),
                    lora=loads.get(name, []),
                )
            ),
        )
        for name, m in file.models.items()
        if m.path is not None
    }
    remote = {
        name: upstreams.spec_of(name, m, base_dir, os.environ) for name, m in file.models.items() if m.upstream is not None
    }
    srv = file.server
    # Paths in [server] are relative to the config file, as model paths are.
    server = replace(
        srv,
        tls_cert=None if srv.tls_cert is None else str(resolve_path(srv.tls_cert, base_dir)),
        tls_key=None if srv.tls_key is None else str(resolve_path(srv.tls_key, base_dir)),
        api_keys_file=None if srv.api_keys_file is None else str(resolve_path(srv.api_keys_file, base_dir)),
        models_dir=None if srv.models_dir is None else str(resolve_path(srv.models_dir, base_dir)),
        pid_file=None if srv.pid_file is None else str(resolve_path(srv.pid_file, base_dir)),
        state_dir=None if srv.state_dir is None else str(resolve_path(srv.state_dir, base_dir)),
    )
    return with_server(
        Config(
            server, file.supervisor, models, keys=keyring, unloadable=unloadable, upstreams=remote,
            fleet_key=upstreams.fleet_key(file.server, base_dir, os.environ)[0], lora=views,
        ),
        overrides,
    )


def _keys(file: ConfigFile, base_dir: Path, env: str | None) -> tuple[Keyring, list[str]]:
    """The keyring from api_keys, admin_keys, the keys file and CORRAL_API_KEYS, and what
    is wrong with them (no problem quotes a key)."""
    srv = file.server
    sources: list[KeySource] = list(keys.from_config(srv.api_keys, srv.admin_keys))
    problems: list[str] = []
    if srv.api_keys_file is not None:
        path = resolve_path(srv.api_keys_file, base_dir)
        try:
            sources += keys.from_file(path)
        except KeyFileError as exc:
            problems.append(f"server.api_keys_file: {exc}")
        except UnicodeDecodeError:
            problems.append(f"server.api_keys_file: {path} is not UTF-8 text")
        except OSError as exc:
            problems.append(f"server.api_keys_file: cannot read {path}: {exc.strerror}")
    sources += keys.from_env(env)
    problems += keys.problems(sources)
    names = {alias: name for name, m in file.models.items() for alias in (name, *m.aliases)}
    keyring, unknown = keys.keyring(sources, names)
    return keyring, problems + unknown


# The file's top-level tables ([model_defaults] is folded into the models before this).
_SECTIONS = ("server", "supervisor", "models", "model_defaults")


def _convert(raw: dict[str, object]) -> tuple[ConfigFile, set[str], list[str]]:
    """Type-check the file key by key (supervisor/config/convert.py): the file built from
    what passed, the names of models whose table could not be built, and every problem."""
    problems: list[str] = []
    for key, value in raw.items():
        if key in _SECTIONS:
            continue
        close = suggestion(key, _SECTIONS)
        if isinstance(value, dict) and close:
            # [model.a] for [models.a]: name the tables as the file spells them.
            right = close.removeprefix(" (did you mean ").removesuffix("?)")
            subs = [k for k, v in value.items() if isinstance(v, dict)] if right == "models" else []
            for sub in subs or [None]:
                wrong = f"{key}.{quote(sub)}" if sub is not None else key
                good = f"{right}.{quote(sub)}" if sub is not None else right
                problems.append(f"[{wrong}]: unknown table (did you mean [{good}]?)")
        else:
            problems.append(f"{key}: unknown {'table' if isinstance(value, dict) else 'key'}{close}")
    server = convert_table(raw.get("server", {}), ServerConfig, "server", problems) or ServerConfig()
    supervisor = convert_table(raw.get("supervisor", {}), SupervisorConfig, "supervisor", problems) or SupervisorConfig()
    models: dict[str, ModelConfig] = {}
    broken: set[str] = set()
    tables = raw.get("models", {})
    if not isinstance(tables, dict):
        problems.append(f"models: expected tables [models.NAME], got {show(tables)}")
        tables = {}
    elif not tables:
        problems.append("models: at least one [models.NAME] table is required")
    for name, table in tables.items():
        m = convert_table(table, ModelConfig, f"models.{quote(name)}", problems)
        if m is None:
            broken.add(name)
        else:
            models[name] = m
    return ConfigFile(server, supervisor, models), broken, problems




def _apply_model_defaults(raw: dict[str, object]) -> list[str]:
    """Fold `[model_defaults]` into every model table (a table's own keys win), and say
    what is wrong with it. It is checked on its own, so a mistake is reported once under
    its own name rather than once per model."""
    defaults = raw.pop("model_defaults", None)
    if defaults is None:
        return []
    if not isinstance(defaults, dict):
        return ["model_defaults: expected a table"]
    problems = [
        f"model_defaults.{key}: set per model, not for all" for key in ("path", "aliases", "upstream") if key in defaults
    ]
    convert_table({**defaults, "path": ""}, ModelConfig, "model_defaults", problems)
    if problems:
        return problems
    tables = raw.get("models")
    if isinstance(tables, dict):
        for name, table in tables.items():
            if isinstance(table, dict):
                # A model served elsewhere takes the upstream keys (timeout, api_key_env, ...);
                # one served here, the others; one that is both, all of them.
                remote = "upstream" in table
                local = "path" in table or not remote
                applies = {k: v for k, v in defaults.items() if (remote if k in UPSTREAM_KEYS else local)}
                tables[name] = {**applies, **table}
    return []


def load(path: str | os.PathLike[str], server_overrides: dict[str, object] | None = None) -> Config:
    """Read and validate a config file; model paths are relative to its folder."""
    return from_bytes(read_bytes(path), path, server_overrides)


def without_file(server_overrides: dict[str, object], base_dir: Path | None = None) -> Config:
    """The config of `corral serve --models-dir DIR` with no config file: every default,
    and the command line's [server] keys. Raises ConfigError."""
    return parse("", base_dir or Path.cwd(), "", os.environ.get(keys.ENV), server_overrides)


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """A config file's bytes, as they are now. Raises ConfigError."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError([f"(file): cannot read: {exc.strerror}"], str(path)) from exc


def from_bytes(
    data: bytes, path: str | os.PathLike[str], server_overrides: dict[str, object] | None = None
) -> Config:
    """Validate a config file's bytes, read from `path`. Raises ConfigError."""
    p = Path(path).resolve()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:  # TOML is UTF-8; anything else must not escape a SIGHUP
        raise ConfigError([f"(file): not UTF-8 text (byte {exc.start})"], str(path)) from exc
    cfg = parse(text, p.parent, str(path), os.environ.get(keys.ENV), server_overrides)
    return dataclasses.replace(cfg, source=p)


def with_server(cfg: Config, overrides: dict[str, object]) -> Config:
    """`cfg` with [server] keys replaced (`corral serve --host/--port`): applied to the
    file at start and at every reload, so that a reload does not see them as changes."""
    if not overrides:
        return cfg
    return dataclasses.replace(cfg, server=replace(cfg.server, **overrides))




def _template(value: str | None, base_dir: Path) -> str | None:
    if value is None or value in BUILTIN_CHAT_TEMPLATES:
        return value
    return str(resolve_path(value, base_dir))


def generation_defaults(m: ModelConfig) -> dict[str, Any]:
    """`m`'s generation defaults, as keyword arguments for its spec."""
    own = set(GenerationDefaults.__struct_fields__) - set(ModelOptions.__struct_fields__)
    return {name: getattr(m, name) for name in own}

