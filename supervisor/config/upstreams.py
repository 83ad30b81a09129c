"""A `[models.NAME]` table that names an `upstream`: what it must satisfy, and the
`UpstreamSpec` the router relays by (router/upstream/).

A table with `upstream` and no `path` is served elsewhere only: it runs no worker here, so
a worker option or a generation default in it would be silently ignored. It is refused,
naming the key, as is an upstream key in a table that has no `upstream`. The key to send
is read here, at start and at each reload, so that a rotated key file applies on SIGHUP.
"""

from __future__ import annotations

import math
import os
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path

import msgspec

from supervisor.config.schema import UPSTREAM_KEYS, ModelConfig, ServerConfig, UpstreamSpec

# The API dialects Corral serves (router/api/*), by the name each registers.
DIALECTS = ("openai", "anthropic", "responses", "ollama", "llama")

MAX_TIMEOUT = 86400.0

MISSING_PATH = "required key is missing (or give `upstream`, the URL of a server that serves the model)"

# Keys that mean the same for a model served elsewhere.
_SHARED_KEYS = ("path", "aliases", "tags")

_DEFAULTS = {f.name: f.default for f in msgspec.structs.fields(ModelConfig)}
_FACTORIES = {f.name: f.default_factory for f in msgspec.structs.fields(ModelConfig)}


def _default(key: str) -> object:
    default = _DEFAULTS[key]
    return _FACTORIES[key]() if default is msgspec.NODEFAULT else default


def set_keys(m: ModelConfig) -> list[str]:
    """The keys of `m` whose value is not the default (what the table sets, in effect)."""
    return [key for key in ModelConfig.__struct_fields__ if getattr(m, key) != _default(key)]


def urls_of(m: ModelConfig) -> list[str]:
    if m.upstream is None:
        return []
    return [m.upstream] if isinstance(m.upstream, str) else list(m.upstream)


# A base URL that ends in a route: the routes are appended to it, so it must not name one.
_ROUTE_ENDINGS = ("/chat/completions", "/completions", "/embeddings", "/messages", "/responses", "/models")


def _url_problem(url: str) -> str | None:
    if url != url.strip() or any(c.isspace() or not c.isprintable() for c in url):
        return f"{url!r} has spaces or control characters"
    if not url.isascii():
        return f"{url!r} has characters outside ASCII: write the host in its xn-- form and escape the path"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"{url!r} is not an http:// or https:// URL"
    if not parts.hostname:
        return f"{url!r} names no host"
    if parts.query or parts.fragment or parts.username or parts.password:
        return f"{url!r}: give the base URL only (\"http://host:8080/v1\"), with no query, fragment or credentials"
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        return f"{url!r} has a port that is not a number in 1..65535"
    if parts.path.rstrip("/").endswith(_ROUTE_ENDINGS):
        return f"{url!r} names a route: give the base URL the routes are under (\"http://host:8080/v1\")"
    return None


def problems(at: str, m: ModelConfig, base_dir: Path, environ: Mapping[str, str]) -> Iterator[str]:
    """What is wrong with the upstream side of the table at `at` (`models.NAME`)."""
    urls = urls_of(m)
    if m.path is None and m.upstream is None:
        yield f"{at}.path: {MISSING_PATH}"
        return
    if m.upstream is None:
        for key in UPSTREAM_KEYS:
            if key in set_keys(m):
                yield f"{at}.{key}: only applies to a model with `upstream` (a model served elsewhere)"
        return
    if not urls:
        yield f"{at}.upstream: give at least one URL"
    seen: set[str] = set()
    for i, url in enumerate(urls):
        where = f"{at}.upstream" + (f"[{i}]" if isinstance(m.upstream, list) else "")
        if (why := _url_problem(url)) is not None:
            yield f"{where}: {why}"
        elif url.rstrip("/") in seen:
            yield f"{where}: {url!r} is listed twice"
        seen.add(url.rstrip("/"))
    if m.path is None:
        for key in set_keys(m):
            if key not in UPSTREAM_KEYS and key not in _SHARED_KEYS:
                yield (
                    f"{at}.{key}: applies to a model served here (with `path`); this one is served by "
                    "its `upstream`, which has its own settings"
                )
    if m.upstream_model is not None and not m.upstream_model.strip():
        yield f"{at}.upstream_model: must not be empty"
    if not math.isfinite(m.timeout) or not 0 < m.timeout <= MAX_TIMEOUT:
        yield f"{at}.timeout: must be above 0 and at most {MAX_TIMEOUT:g} seconds (a day), got {m.timeout}"
    if m.max_concurrency is not None and m.max_concurrency < 1:
        yield f"{at}.max_concurrency: must be at least 1, got {m.max_concurrency}"
    if not m.upstream_dialects:
        yield f"{at}.upstream_dialects: give at least one of {', '.join(DIALECTS)}"
    for i, dialect in enumerate(m.upstream_dialects):
        if dialect not in DIALECTS:
            yield f"{at}.upstream_dialects[{i}]: {dialect!r} is not one of {', '.join(DIALECTS)}"
    _, why = _api_key(at, m, base_dir, environ)
    if why is not None:
        yield why


def _api_key(at: str, m: ModelConfig, base_dir: Path, environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The key to send upstream, or the problem in reading it."""
    return read_key(f"{at}.api_key_env", m.api_key_env, f"{at}.api_key_file", m.api_key_file, base_dir, environ)


def read_key(
    env_at: str, env: str | None, file_at: str, file: str | None, base_dir: Path, environ: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """A key to send to another server, from the environment variable `env` or the file
    `file` (relative to the config's folder), or the problem in reading it, named by the
    key's place in the file (`env_at`, `file_at`)."""
    if env is not None and file is not None:
        return None, f"{file_at}: set {env_at.rsplit('.', 1)[-1]} or {file_at.rsplit('.', 1)[-1]}, not both"
    if env is not None:
        value = environ.get(env, "").strip()
        if not value:
            return None, f"{env_at}: the environment variable {env} is not set"
        if (why := _key_problem(value)) is not None:
            return None, f"{env_at}: the key in {env} {why}"
        return value, None
    if file is not None:
        path = (base_dir / os.path.expanduser(file)).resolve()
        try:
            value = path.read_text(encoding="utf-8-sig").strip()  # a BOM, as Notepad writes one, is no part of it
        except OSError as exc:
            return None, f"{file_at}: cannot read {path}: {exc.strerror}"
        except UnicodeDecodeError:
            return None, f"{file_at}: {path} is not UTF-8 text"
        if not value or "\n" in value:
            return None, f"{file_at}: {path} must hold one key on one line"
        if (why := _key_problem(value)) is not None:
            return None, f"{file_at}: the key in {path} {why}"
        return value, None
    return None, None


def fleet_problems(server: ServerConfig, base_dir: Path, environ: Mapping[str, str]) -> Iterator[str]:
    """What is wrong with [server]'s fleet: its URLs (a server's root, where /admin/models
    is), and its key."""
    for i, url in enumerate(server.fleet):
        if (why := _url_problem(url)) is not None:
            yield f"server.fleet[{i}]: {why}"
        elif urllib.parse.urlsplit(url).path.rstrip("/"):
            yield f"server.fleet[{i}]: {url!r}: give the server's root URL (\"http://host:8080\"), with no path"
    _, why = fleet_key(server, base_dir, environ)
    if why is not None:
        yield why


def fleet_key(server: ServerConfig, base_dir: Path, environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    return read_key(
        "server.fleet_key_env", server.fleet_key_env, "server.fleet_key_file", server.fleet_key_file, base_dir, environ
    )


def _key_problem(key: str) -> str | None:
    """A key goes in a header: visible ASCII only (RFC 9110 field values, no spaces)."""
    if not all("!" <= c <= "~" for c in key):
        return "has characters a header cannot carry (spaces, control characters or non-ASCII)"
    return None


def spec_of(name: str, m: ModelConfig, base_dir: Path, environ: Mapping[str, str]) -> UpstreamSpec:
    """The relay's view of a table that `problems` passed."""
    key, _ = _api_key("", m, base_dir, environ)
    return UpstreamSpec(
        name=name,
        urls=tuple(url.rstrip("/") for url in urls_of(m)),
        model=m.upstream_model or name,
        api_key=key,
        api_key_env=m.api_key_env,
        api_key_file=m.api_key_file,
        timeout=m.timeout,
        max_concurrency=m.max_concurrency,
        dialects=frozenset(m.upstream_dialects),
        cache_salt=m.upstream_cache_salt,
        aliases=tuple(m.aliases),
        tags=tuple(m.tags),
        local=m.path is not None,
    )
