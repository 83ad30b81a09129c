"""The TOML config: schema, loading and validation.

Parsing is stdlib `tomllib`; the schema is msgspec Structs that reject unknown keys. Every
error is reported as `key.path: what is wrong`, so that `corral config check`, startup and
(later) reload all say the same thing. A model file that cannot load is the exception: it
is reported the same way but in `Config.unloadable`, so that one bad download fails that
model alone (supervisor/model_loop.py) while `config check` still refuses it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal

import msgspec
from msgspec.structs import replace

from supervisor import gguf_meta, models_dir
from supervisor.capacity import parse_size
from supervisor.config_types import Seconds, convert_table, show, suggestion
from supervisor import keys
from supervisor.keys import ApiKeyTable, KeyFileError, Keyring, KeySource
from supervisor.templates import BUILTIN_CHAT_TEMPLATES
from worker.protocol import ModelOptions, options_of


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    host: str = "127.0.0.1"
    port: int = 8080
    # Upper bound on a request body; OpenAI payloads with long chats stay far below it.
    max_body_bytes: int = 16 * 1024 * 1024
    # On SIGTERM/SIGINT, how long requests in flight may take to finish before being cut.
    drain_timeout: Seconds = 30.0
    # Where a request that names no model goes (a name or an alias). Without it, a request
    # must name its model. Applies on reload, unlike the keys above.
    default_model: str | None = None
    # Keys (supervisor/keys.py). With any API key, every route but /health needs a key.
    # /admin/* and /metrics need an admin key; with none configured, they answer loopback
    # clients only. All three apply on reload, and a reload re-reads the file.
    api_keys: list[str | ApiKeyTable] = []
    api_keys_file: str | None = None
    admin_keys: list[str] = []
    # Serving on an address other than loopback with no API key is refused unless this is
    # set: anyone who can reach the port could use the models and reload the config.
    allow_insecure_bind: bool = False
    # HTTPS: a PEM certificate (chain) and its private key, both or neither.
    tls_cert: str | None = None
    tls_key: str | None = None
    # Origins a browser page may call Corral from ("https://app.example", or "*"); none by
    # default: a request from any other page is refused (router/site_guard.py). Applies on
    # reload.
    cors_origins: list[str] = []
    # Names (or addresses) by which clients may reach the server while no API key is
    # configured, besides loopback names and the address it listens on: a reverse proxy's
    # public name. ".example.com" admits every name under it; "*" turns the check off.
    # Guards against DNS rebinding (router/site_guard.py). Applies on reload.
    allowed_hosts: list[str] = []
    # "text" or "json" (one object a line) for the server's and its workers' logs, the
    # access log included.
    log_format: Literal["text", "json"] = "text"
    # A folder whose *.gguf files are served under their file stems, with no table each
    # (supervisor/models_dir.py); a [models.NAME] table of the same name overrides one.
    # Rescanned at every reload; relative to the config file.
    models_dir: str | None = None
    # Where `corral serve` writes its pid at start (atomically) and removes it at exit, so
    # that `corral config ... --reload --signal` can send it SIGHUP. Relative to the file.
    pid_file: str | None = None


class SupervisorConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    idle_timeout: Seconds = 600.0  # seconds; 0 = never unload
    start_timeout: Seconds = 120.0  # seconds from spawn to Ready
    stop_grace: Seconds = 5.0  # seconds between SIGTERM and SIGKILL
    # A ping over the worker socket every health_interval seconds (0 disables). A worker
    # that has not answered for health_misses intervals is hung: it is killed and replaced.
    health_interval: Seconds = 10.0
    health_misses: int = 3
    # A worker that fails to load, or dies within min_uptime seconds of Ready, is a failed
    # start: retried after backoff_base * 2^(n-1) seconds (capped at backoff_max), and after
    # start_retries failures in a row the model is failed until a reset or reload.
    min_uptime: Seconds = 5.0
    start_retries: int = 3
    backoff_base: Seconds = 1.0
    backoff_max: Seconds = 60.0
    # Capacity. A model that does not fit evicts the least recently used idle, unpinned
    # models; if none can go, its requests queue (first come, first served) for up to
    # load_wait seconds, then get 503 with Retry-After. load_wait also bounds a request's
    # wait through a backoff. A model's cost is its GGUF size plus its KV cache until it
    # has loaded, then its worker's resident memory.
    max_loaded_models: int = 0  # 0: no limit
    memory_budget: int | str = 0  # bytes, or "12GiB", "8GB", ...; 0: no limit
    load_wait: Seconds = 60.0
    # A reload (SIGHUP, POST /admin/reload) applies the file once it has stayed the same
    # for this long, so a file caught mid-write is never applied half-written.
    reload_settle: Seconds = 0.5


class ModelConfig(ModelOptions, forbid_unknown_fields=True, frozen=True):
    """A `[models.NAME]` table: the worker's options (inherited), and the supervisor's own."""

    path: str
    aliases: list[str] = []
    idle_timeout: Seconds | None = None  # overrides [supervisor] idle_timeout
    preload: bool = False  # load at start instead of on the first request
    pinned: bool = False  # never unloaded for idleness
    # Requests waiting for a slot (supervisor/slot_queue.py): beyond max_queue a request
    # gets 429 at once (None: no bound); after queue_timeout seconds in line, 503 (0: no
    # limit).
    max_queue: int | None = None
    queue_timeout: Seconds = 0.0
    # The token limit of a request that sets none (max_tokens, max_completion_tokens or
    # n_predict). None: the chat runs until the model stops or the context is full, and
    # a legacy completion stops at 16, as OpenAI's does.
    max_tokens: int | None = None


class ConfigFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    server: ServerConfig = ServerConfig()
    supervisor: SupervisorConfig = SupervisorConfig()
    models: dict[str, ModelConfig] = {}


class ConfigError(Exception):
    """One or more problems in a config file, each as `key.path: message`."""

    def __init__(self, problems: list[str], source: str = "") -> None:
        # Problems end up in one-line places (the log, systemd's STATUS=, a JSON field);
        # a key such as [models."a\nb"] must not break them.
        self.problems = [_one_line(p) for p in problems]
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(self.problems))


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ModelSpec(ModelOptions, frozen=True):
    """A model as the supervisor runs it: config with paths resolved and defaults applied.

    A Struct like the config it comes from, so that it inherits the worker's options
    rather than repeating them; a reload compares two of them whole.
    """

    name: str
    path: Path
    aliases: tuple[str, ...]
    idle_timeout: float
    preload: bool = False
    pinned: bool = False
    max_queue: int | None = None
    queue_timeout: float = 0.0
    max_tokens: int | None = None


@dataclass(frozen=True)
class Config:
    server: ServerConfig
    supervisor: SupervisorConfig
    models: dict[str, ModelSpec]
    source: Path | None = None
    # Every key from api_keys, api_keys_file, CORRAL_API_KEYS and admin_keys.
    keys: Keyring = Keyring()
    # Models whose file cannot load (gone, not a GGUF file, cut short): name -> the
    # problem, as `models.<name>.path: ...`. Not a reason to refuse the file: `serve` and a
    # reload run the other models and show these as failed; `config check` fails on them.
    unloadable: dict[str, str] = field(default_factory=dict)

    def resolve(self, name: str) -> ModelSpec | None:
        """The model a request's `model` field names, by name or alias."""
        spec = self.models.get(name)
        if spec is not None:
            return spec
        for spec in self.models.values():
            if name in spec.aliases:
                return spec
        return None


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
    problems = early + problems + list(_check(file, base_dir, broken))
    keyring, key_problems = _keys(file, base_dir, api_keys_env)
    problems += key_problems
    # A file that is not a GGUF model, or was cut short, would fail every load.
    unloadable = {
        name: f"models.{_key(name)}.path: {why}"
        for name, m in file.models.items()
        if (why := gguf_meta.problem(_resolve(m.path, base_dir))) is not None
    }
    if problems:  # refused anyway: every problem in one go
        raise ConfigError(problems + list(unloadable.values()), source)
    default_idle = file.supervisor.idle_timeout
    models = {
        name: ModelSpec(
            name=name,
            path=_resolve(m.path, base_dir),
            aliases=tuple(m.aliases),
            idle_timeout=default_idle if m.idle_timeout is None else m.idle_timeout,
            preload=m.preload,
            pinned=m.pinned,
            max_queue=m.max_queue,
            queue_timeout=m.queue_timeout,
            max_tokens=m.max_tokens,
            # The worker's options pass as written, except a template file's path: it is
            # relative to the config file, which the worker knows nothing of.
            **options_of(replace(m, chat_template=_template(m.chat_template, base_dir))),
        )
        for name, m in file.models.items()
    }
    srv = file.server
    # Paths in [server] are relative to the config file, as model paths are.
    server = replace(
        srv,
        tls_cert=None if srv.tls_cert is None else str(_resolve(srv.tls_cert, base_dir)),
        tls_key=None if srv.tls_key is None else str(_resolve(srv.tls_key, base_dir)),
        api_keys_file=None if srv.api_keys_file is None else str(_resolve(srv.api_keys_file, base_dir)),
        models_dir=None if srv.models_dir is None else str(_resolve(srv.models_dir, base_dir)),
        pid_file=None if srv.pid_file is None else str(_resolve(srv.pid_file, base_dir)),
    )
    return with_server(Config(server, file.supervisor, models, keys=keyring, unloadable=unloadable), overrides)


def _keys(file: ConfigFile, base_dir: Path, env: str | None) -> tuple[Keyring, list[str]]:
    """The keyring from api_keys, admin_keys, the keys file and CORRAL_API_KEYS, and what
    is wrong with them (no problem quotes a key)."""
    srv = file.server
    sources: list[KeySource] = list(keys.from_config(srv.api_keys, srv.admin_keys))
    problems: list[str] = []
    if srv.api_keys_file is not None:
        path = _resolve(srv.api_keys_file, base_dir)
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
    """Type-check the file key by key (supervisor/config_types.py): the file built from
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
                wrong = f"{key}.{_key(sub)}" if sub is not None else key
                good = f"{right}.{_key(sub)}" if sub is not None else right
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
        m = convert_table(table, ModelConfig, f"models.{_key(name)}", problems)
        if m is None:
            broken.add(name)
        else:
            models[name] = m
    return ConfigFile(server, supervisor, models), broken, problems


def _key(name: str) -> str:
    """A key as TOML writes it in a dotted path: bare if it can be, quoted if not."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name, ensure_ascii=False)


def _apply_model_defaults(raw: dict[str, object]) -> list[str]:
    """Fold `[model_defaults]` into every model table (a table's own keys win), and say
    what is wrong with it. It is checked on its own, so a mistake is reported once under
    its own name rather than once per model."""
    defaults = raw.pop("model_defaults", None)
    if defaults is None:
        return []
    if not isinstance(defaults, dict):
        return ["model_defaults: expected a table"]
    problems = [f"model_defaults.{key}: set per model, not for all" for key in ("path", "aliases") if key in defaults]
    convert_table({**defaults, "path": ""}, ModelConfig, "model_defaults", problems)
    if problems:
        return problems
    tables = raw.get("models")
    if isinstance(tables, dict):
        for name, table in tables.items():
            if isinstance(table, dict):
                tables[name] = {**defaults, **table}
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


def _resolve(path: str, base_dir: Path) -> Path:
    return (base_dir / os.path.expanduser(path)).resolve()


def _template(value: str | None, base_dir: Path) -> str | None:
    if value is None or value in BUILTIN_CHAT_TEMPLATES:
        return value
    return str(_resolve(value, base_dir))


def _seconds(value: float) -> bool:
    """A duration: TOML allows nan and inf, and either would break a timer (0 already
    means "never" where that makes sense)."""
    return math.isfinite(value) and value >= 0


# An Origin header's value (RFC 6454): scheme, host and an optional port, nothing more.
_ORIGIN = re.compile(r"\*|[a-z][a-z0-9+.-]*://[^/?#\s]+")
# A name as Host carries it, without port: DNS labels (".suffix" for every name under it)
# or an IPv4 address; an IPv6 address is checked by _host_entry.
_HOST_NAME = re.compile(r"\.?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")


def _host_entry(value: str) -> bool:
    """An allowed_hosts entry: a name, ".suffix", or an address (IPv6 with or without
    brackets), never a port or a scheme."""
    if ":" not in value:
        return bool(_HOST_NAME.fullmatch(value))
    try:
        ipaddress.IPv6Address(value[1:-1] if value.startswith("[") and value.endswith("]") else value)
    except ValueError:
        return False
    return True


def _check(file: ConfigFile, base_dir: Path, broken: set[str] = set()) -> Iterator[str]:
    """Semantic checks msgspec's types cannot express. Yields `key.path: message`.
    `broken` models had tables too wrong to build; they were reported already."""
    srv, sup = file.server, file.supervisor
    if not srv.host or any(c.isspace() or not c.isprintable() for c in srv.host):
        yield f"server.host: {srv.host!r} is not an address or a host name"
    if not 0 <= srv.port <= 65535:
        yield f"server.port: must be 0..65535, got {srv.port}"
    if not _seconds(srv.drain_timeout):
        yield f"server.drain_timeout: must be a finite number >= 0, got {srv.drain_timeout}"
    if srv.max_body_bytes < 1024:
        yield f"server.max_body_bytes: must be at least 1024, got {srv.max_body_bytes}"
    if sup.health_misses < 1:
        yield f"supervisor.health_misses: must be at least 1, got {sup.health_misses}"
    if sup.max_loaded_models < 0:
        yield f"supervisor.max_loaded_models: must be >= 0 (0 = no limit), got {sup.max_loaded_models}"
    try:
        parse_size(sup.memory_budget)
    except ValueError as exc:
        yield f"supervisor.memory_budget: {exc}"
    pinned = [name for name, m in file.models.items() if m.pinned]
    if sup.max_loaded_models > 0 and len(pinned) > sup.max_loaded_models:
        yield (
            f"supervisor.max_loaded_models: {len(pinned)} models are pinned "
            f"({', '.join(pinned)}), more than max_loaded_models = {sup.max_loaded_models}"
        )
    if sup.start_retries < 0:
        yield f"supervisor.start_retries: must be >= 0, got {sup.start_retries}"
    for key in (
        "idle_timeout", "start_timeout", "stop_grace", "health_interval",
        "min_uptime", "backoff_base", "backoff_max", "load_wait", "reload_settle",
    ):
        if not _seconds(value := getattr(sup, key)):
            yield f"supervisor.{key}: must be a finite number >= 0, got {value}"
    if (srv.tls_cert is None) != (srv.tls_key is None):
        yield "server.tls_cert: tls_cert and tls_key go together: set both, or neither"
    for key in ("tls_cert", "tls_key"):
        if (value := getattr(srv, key)) is not None and not _resolve(value, base_dir).is_file():
            yield f"server.{key}: no such file: {_resolve(value, base_dir)}"
    if srv.pid_file is not None and not _resolve(srv.pid_file, base_dir).parent.is_dir():
        yield f"server.pid_file: no such folder: {_resolve(srv.pid_file, base_dir).parent}"
    for i, origin in enumerate(srv.cors_origins):
        if not _ORIGIN.fullmatch(origin):
            yield (
                f"server.cors_origins[{i}]: {origin!r} is not an origin: scheme://host[:port] "
                'with no path (as a browser sends it), or "*"'
            )
    for i, host in enumerate(srv.allowed_hosts):
        if host != "*" and not _host_entry(host):
            yield (
                f"server.allowed_hosts[{i}]: {host!r} is not a host name or address: a name as "
                'clients send it in Host, without scheme or port ("llm.example.com"), '
                '".example.com" for every name under it, or "*"'
            )
    default = srv.default_model
    if default is not None and default not in file.models and default not in broken and not any(
        default in m.aliases for m in file.models.values()
    ):
        yield f"server.default_model: {default!r} is neither a model nor an alias in [models]"
    seen: dict[str, str] = {name: f"models.{name}" for name in file.models}
    for name, m in file.models.items():
        at = f"models.{_key(name)}"
        if not name.strip():
            yield f"{at}: model name must not be empty"
        elif not name.isprintable():
            yield f"{at}: model name {name!r} has control characters"
        if not 1 <= m.slots <= 256:
            yield f"{at}.slots: must be 1..256, got {m.slots}"
        if m.n_ctx < 16:
            yield f"{at}.n_ctx: must be at least 16, got {m.n_ctx}"
        if not 1 <= m.n_batch:
            yield f"{at}.n_batch: must be at least 1, got {m.n_batch}"
        if m.threads is not None and not 1 <= m.threads <= 1024:
            yield f"{at}.threads: must be 1..1024, got {m.threads}"
        if m.n_gpu_layers < -1:
            yield f"{at}.n_gpu_layers: must be -1 (all) or more, got {m.n_gpu_layers}"
        if m.max_tokens is not None and m.max_tokens < 1:
            yield f"{at}.max_tokens: must be at least 1, got {m.max_tokens}"
        if m.max_queue is not None and m.max_queue < 0:
            yield f"{at}.max_queue: must be >= 0 (0: no waiting at all), got {m.max_queue}"
        if not _seconds(m.queue_timeout):
            yield f"{at}.queue_timeout: must be a finite number >= 0 (0: no limit), got {m.queue_timeout}"
        if m.idle_timeout is not None and not _seconds(m.idle_timeout):
            yield f"{at}.idle_timeout: must be a finite number >= 0, got {m.idle_timeout}"
        if m.pooling is not None and not m.embeddings:
            yield f"{at}.pooling: only applies with embeddings = true"
        elif m.pooling in ("none", "rank"):
            # /v1/embeddings returns one vector per input; these give something else.
            what = "a reranker's relevance score" if m.pooling == "rank" else "one vector per token"
            yield (
                f"{at}.pooling: {m.pooling!r} gives {what}, which /v1/embeddings cannot "
                "return; use mean, cls or last"
            )
        if m.chat_template is not None and m.chat_template not in BUILTIN_CHAT_TEMPLATES:
            t = _resolve(m.chat_template, base_dir)
            if not t.is_file():
                yield (
                    f"{at}.chat_template: {m.chat_template!r} is neither a Jinja file nor a "
                    f"built-in template (built-in: {', '.join(sorted(BUILTIN_CHAT_TEMPLATES))})"
                )
        if m.tool_format not in ("auto", "generic") and m.chat_template in BUILTIN_CHAT_TEMPLATES:
            # A built-in template is C++ code that renders no tools; only the generic
            # format, which offers tools in a system message, works with one.
            yield (
                f"{at}.tool_format: {m.tool_format!r} needs a Jinja chat template; the built-in "
                f"template {m.chat_template!r} takes tools only with tool_format = \"generic\""
            )
        for i, alias in enumerate(m.aliases):
            if not alias.strip():
                yield f"{at}.aliases[{i}]: must not be empty"
            elif not alias.isprintable():
                yield f"{at}.aliases[{i}]: {alias!r} has control characters"
            elif alias in seen:
                yield f"{at}.aliases[{i}]: {alias!r} is already used by {seen[alias]}"
            else:
                seen[alias] = f"{at}.aliases"
