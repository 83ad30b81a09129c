"""What a config must satisfy beyond its types: ranges, paths that exist, names that can
be an Origin or a Host, sizes that parse. Each problem is yielded as `key.path: message`,
so that `corral config check`, startup and a reload all say the same thing.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from pathlib import Path
from typing import Iterator

from supervisor.capacity import gpu_budget, parse_size
from supervisor.config import gguf_meta, projector
from supervisor.config.key_paths import quote
from supervisor.config.load_checks import load_problems
from supervisor.config.schema import ConfigFile, ModelConfig, listen_hosts
from supervisor.config.templates import BUILTIN_CHAT_TEMPLATES
from worker.protocol import MAX_STOP_STRINGS, SAMPLING_RANGES, TEMPLATE_OWN_VARIABLES, sequences


def resolve_path(path: str, base_dir: Path) -> Path:
    """A path as the file writes it (~ expanded), relative to the file's folder."""
    return (base_dir / os.path.expanduser(path)).resolve()


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


def check(file: ConfigFile, base_dir: Path, broken: set[str] = set()) -> Iterator[str]:
    """Semantic checks msgspec's types cannot express. Yields `key.path: message`.
    `broken` models had tables too wrong to build; they were reported already."""
    srv, sup = file.server, file.supervisor
    hosts = listen_hosts(srv)
    if not hosts:
        yield "server.host: give at least one address"
    for i, host in enumerate(hosts):
        at = "server.host" if isinstance(srv.host, str) else f"server.host[{i}]"
        if not host or any(c.isspace() or not c.isprintable() for c in host):
            yield f"{at}: {host!r} is not an address or a host name"
    if len(set(hosts)) != len(hosts):
        yield "server.host: an address is listed twice"
    if not 0 <= srv.port <= 65535:
        yield f"server.port: must be 0..65535, got {srv.port}"
    if not _seconds(srv.drain_timeout):
        yield f"server.drain_timeout: must be a finite number >= 0, got {srv.drain_timeout}"
    if srv.max_body_bytes < 1024:
        yield f"server.max_body_bytes: must be at least 1024, got {srv.max_body_bytes}"
    if srv.max_keep_alive is not None and not _seconds(srv.max_keep_alive):
        yield f"server.max_keep_alive: must be a finite number >= 0 (0: no bound), got {srv.max_keep_alive}"
    if not _seconds(srv.responses_ttl):
        yield f"server.responses_ttl: must be a finite number >= 0, got {srv.responses_ttl}"
    if srv.responses_max_bytes < 0:
        yield f"server.responses_max_bytes: must be >= 0 (0 keeps no response), got {srv.responses_max_bytes}"
    if sup.health_misses < 1:
        yield f"supervisor.health_misses: must be at least 1, got {sup.health_misses}"
    if sup.max_loaded_models < 0:
        yield f"supervisor.max_loaded_models: must be >= 0 (0 = no limit), got {sup.max_loaded_models}"
    for key in ("memory_budget", "prompt_cache_budget"):
        try:
            parse_size(getattr(sup, key))
        except ValueError as exc:
            yield f"supervisor.{key}: {exc}"
    try:
        gpu_budget(sup.gpu_memory_budget)
    except ValueError as exc:
        yield f"supervisor.gpu_memory_budget.{exc}" if isinstance(sup.gpu_memory_budget, dict) else f"supervisor.gpu_memory_budget: {exc}"
    pinned = [name for name, m in file.models.items() if m.pinned]
    # Each instance is a worker of its own, and max_loaded_models counts workers.
    held = sum(max(m.instances, 1) for m in file.models.values() if m.pinned)
    if sup.max_loaded_models > 0 and held > sup.max_loaded_models:
        yield (
            f"supervisor.max_loaded_models: {len(pinned)} models are pinned "
            f"({', '.join(pinned)}), {held} workers with their instances, "
            f"more than max_loaded_models = {sup.max_loaded_models}"
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
        if (value := getattr(srv, key)) is not None and not resolve_path(value, base_dir).is_file():
            yield f"server.{key}: no such file: {resolve_path(value, base_dir)}"
    if srv.slot_save_path is not None and not resolve_path(srv.slot_save_path, base_dir).is_dir():
        yield f"server.slot_save_path: not a directory: {resolve_path(srv.slot_save_path, base_dir)}"
    if srv.slot_save_max_bytes < 0:
        yield f"server.slot_save_max_bytes: must be 0 (no bound) or more, got {srv.slot_save_max_bytes}"
    if srv.pid_file is not None and not resolve_path(srv.pid_file, base_dir).parent.is_dir():
        yield f"server.pid_file: no such folder: {resolve_path(srv.pid_file, base_dir).parent}"
    if srv.state_dir is not None and (state := resolve_path(srv.state_dir, base_dir)).exists() and not state.is_dir():
        yield f"server.state_dir: not a directory: {state}"
    for key in ("usage_hourly_for", "usage_daily_for"):
        if not _seconds(value := getattr(srv, key)):
            yield f"server.{key}: must be a finite number >= 0, got {value}"
    for i, origin in enumerate(srv.cors_origins):
        if not _ORIGIN.fullmatch(origin) and not _host_entry(origin):
            yield (
                f"server.cors_origins[{i}]: {origin!r} is not an origin: scheme://host[:port] "
                'with no path (as a browser sends it), a host pattern ("localhost", '
                '"chat.example", ".example.com") or "*"'
            )
    for i, host in enumerate(srv.allowed_hosts):
        if host != "*" and not _host_entry(host):
            yield (
                f"server.allowed_hosts[{i}]: {host!r} is not a host name or address: a name as "
                'clients send it in Host, without scheme or port ("llm.example.com"), '
                '".example.com" for every name under it, or "*"'
            )
    for i, host in enumerate(srv.image_url_hosts):
        if not _host_entry(host):
            yield (
                f"server.image_url_hosts[{i}]: {host!r} is not a host name or address: a name without scheme, "
                'port or path ("images.example.com"), or ".example.com" for every name under it'
            )
    default = srv.default_model
    if default is not None and default not in file.models and default not in broken and not any(
        default in m.aliases for m in file.models.values()
    ):
        yield f"server.default_model: {default!r} is neither a model nor an alias in [models]"
    seen: dict[str, str] = {name: f"models.{name}" for name in file.models}
    for name, m in file.models.items():
        at = f"models.{quote(name)}"
        if not name.strip():
            yield f"{at}: model name must not be empty"
        elif not name.isprintable():
            yield f"{at}: model name {name!r} has control characters"
        if not 1 <= m.slots <= 256:
            yield f"{at}.slots: must be 1..256, got {m.slots}"
        if m.cached_prompts is not None and not 0 <= m.cached_prompts <= 256 - m.slots:
            yield f"{at}.cached_prompts: must be 0..{max(0, 256 - m.slots)} (256 sequences less the slots), got {m.cached_prompts}"
        if m.prompt_cache_dir is not None:
            problem = _folder_problem(resolve_path(m.prompt_cache_dir, base_dir))
            if problem:
                yield f"{at}.prompt_cache_dir: {problem}"
        for key in ("prompt_cache_bytes", "prompt_cache_disk_bytes"):
            if getattr(m, key) < 0:
                yield f"{at}.{key}: must be 0 or more bytes, got {getattr(m, key)}"
        if not 1 <= m.draft_max <= 256:
            yield f"{at}.draft_max: must be 1..256, got {m.draft_max}"
        if m.spec_type == "draft" and m.draft_model is None:
            yield f'{at}.spec_type: "draft" needs draft_model, the path of a smaller model with the same vocabulary'
        if m.draft_model is not None:
            if (why := gguf_meta.problem(resolve_path(m.draft_model, base_dir))) is not None:
                yield f"{at}.draft_model: {why}"
            if m.embeddings:
                yield f"{at}.draft_model: an embedding model generates nothing to draft"
        if m.mmproj is not None:
            if m.embeddings:
                yield f"{at}.mmproj: an embedding model takes no images or audio"
            elif m.path is not None and (
                unfit := projector.problem(resolve_path(m.mmproj, base_dir), resolve_path(m.path, base_dir))
            ):
                yield f"{at}.mmproj: {unfit}"
        if not 0.0 <= m.draft_p_min <= 1.0:
            yield f"{at}.draft_p_min: must be 0..1, got {m.draft_p_min}"
        if m.n_ctx < 16:
            yield f"{at}.n_ctx: must be at least 16, got {m.n_ctx}"
        if m.n_ctx_slot is not None and not 16 <= m.n_ctx_slot <= m.n_ctx:
            yield f"{at}.n_ctx_slot: must be 16..n_ctx ({m.n_ctx}), got {m.n_ctx_slot}"
        if not 1 <= m.n_batch:
            yield f"{at}.n_batch: must be at least 1, got {m.n_batch}"
        elif m.n_ctx >= 16 and min(m.n_batch, m.n_ctx) < (n_seq := sequences(m)):
            # llama.cpp reserves an output a sequence in a batch, and aborts the process when
            # a batch holds fewer (GGML_ASSERT in llama_context's output_reserve).
            yield (
                f"{at}.n_batch: must be at least the model's sequences, {n_seq} (slots + cached_prompts), "
                f"and so must n_ctx; got n_batch {m.n_batch}, n_ctx {m.n_ctx}"
            )
        if m.threads is not None and not 1 <= m.threads <= 1024:
            yield f"{at}.threads: must be 1..1024, got {m.threads}"
        if not 1 <= m.instances <= 64:
            yield f"{at}.instances: must be 1..64, got {m.instances}"
        elif m.instances > 1 and m.path is None:
            yield f"{at}.instances: only a local model (with a path) runs instances, got {m.instances}"
        if m.n_gpu_layers < -1:
            yield f"{at}.n_gpu_layers: must be -1 (all) or more, got {m.n_gpu_layers}"
        model_file = resolve_path(m.path, base_dir) if m.path is not None else None
        yield from load_problems(at, m, model_file, m.embeddings, m.n_batch)
        yield from _generation_problems(at, m)
        for key in TEMPLATE_OWN_VARIABLES:
            if key in m.chat_template_kwargs:
                yield f"{at}.chat_template_kwargs.{key}: Corral sets this template variable from each request"
        if m.max_queue is not None and m.max_queue < 0:
            yield f"{at}.max_queue: must be >= 0 (0: no waiting at all), got {m.max_queue}"
        if not _seconds(m.queue_timeout):
            yield f"{at}.queue_timeout: must be a finite number >= 0 (0: no limit), got {m.queue_timeout}"
        if m.idle_timeout is not None and not _seconds(m.idle_timeout):
            yield f"{at}.idle_timeout: must be a finite number >= 0, got {m.idle_timeout}"
        if m.pooling is not None and not m.embeddings:
            yield f"{at}.pooling: only applies with embeddings = true"
        if m.chat_template is not None and m.chat_template not in BUILTIN_CHAT_TEMPLATES:
            t = resolve_path(m.chat_template, base_dir)
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


def _generation_problems(at: str, m: ModelConfig) -> Iterator[str]:
    """A model's generation defaults, held to the ranges a request's own values are."""
    if m.max_tokens is not None and m.max_tokens < 1:
        yield f"{at}.max_tokens: must be at least 1, got {m.max_tokens}"
    if m.n_predict is not None:
        if m.max_tokens is not None:
            yield f"{at}.n_predict: set max_tokens or n_predict (llama-server's name for it), not both"
        elif m.n_predict < -1:
            yield f"{at}.n_predict: must be -1 (no limit) or at least 0, got {m.n_predict}"
    if m.max_tokens_limit is not None:
        name, default = ("max_tokens", m.max_tokens) if m.max_tokens is not None else ("n_predict", m.n_predict)
        if m.max_tokens_limit < 1:
            yield f"{at}.max_tokens_limit: must be at least 1, got {m.max_tokens_limit}"
        elif default is not None and default > m.max_tokens_limit:
            # A default the cap always cuts says two different things: one of them is wrong.
            yield f"{at}.{name}: {default} is above max_tokens_limit ({m.max_tokens_limit}), which caps every request"
    for field, (lo, hi) in SAMPLING_RANGES.items():
        value = getattr(m, field)
        if value is not None and not lo <= value <= hi:  # NaN fails this too
            yield f"{at}.{field}: must be {lo:g}..{hi:g}, got {value}"
    if m.repeat_penalty == 0.0:
        yield f"{at}.repeat_penalty: must be above 0 (1.0 disables it)"
    if m.top_k is not None and m.top_k < 0:
        yield f"{at}.top_k: must be >= 0 (0 disables it), got {m.top_k}"
    if m.repeat_last_n is not None and not -1 <= m.repeat_last_n <= 2**31 - 1:
        yield f"{at}.repeat_last_n: must be -1 (the whole context) or at least 0, got {m.repeat_last_n}"
    if m.seed is not None and not -1 <= m.seed <= 0xFFFFFFFF:
        yield f"{at}.seed: must be -1 (random) or 0..4294967295, got {m.seed}"
    if m.stop is not None:
        if len(m.stop) > MAX_STOP_STRINGS:
            yield f"{at}.stop: at most {MAX_STOP_STRINGS} stop strings, got {len(m.stop)}"
        if any(not s for s in m.stop):
            yield f"{at}.stop: stop strings must not be empty"


def _folder_problem(path: Path) -> str | None:
    """Why the worker could not write saved prompts under `path`, or None: it must be a
    folder, or be creatable under the nearest folder that exists, and writable."""
    if path.exists() and not path.is_dir():
        return f"{str(path)!r} exists and is not a folder"
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"{str(existing)!r} is not a folder this server can write in"
    return None
