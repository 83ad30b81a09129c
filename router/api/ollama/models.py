"""Models as Ollama lists and shows them (/api/tags, /api/show, /api/ps), from the config
and the GGUF file's header (supervisor/config/gguf_meta.py), read without loading it.

Ollama's `digest` is its blob's sha256; hashing a model of gigabytes on every listing would
cost seconds, so Corral's digest is the sha256 of the served model's name and its file's
path, size and modification time: it changes when the file does, which is what clients use
it for, and two served models on one file (a chat model and an embedding model) differ.
Clients take one digest for one model: the `llm-ollama` plugin merges entries that share
one, as Ollama's copies do, so a model's aliases are listed with its digest and two models
never share one.

The context a client reads (`/api/show`'s `model_info["<arch>.context_length"]`, its
`parameters`' num_ctx; `/api/ps`'s `context_length`) is what this server gives one request,
not what the model was trained on: a client that sizes its prompts by the file's 32,768
would send prompts the server refuses.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from supervisor.config import gguf_meta, projector
from supervisor.config.templates import BUILTIN_CHAT_TEMPLATES
from supervisor.group import Served
from supervisor.lifecycle import State

# llama.cpp's llama_ftype (general.file_type) -> the quantization's name.
_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0",
}


def tagged(name: str) -> str:
    """A Corral model's name as Ollama's clients expect one: with a tag."""
    return name if ":" in name else f"{name}:latest"


def untagged(name: str) -> str:
    """What a client's `name:latest` names in Corral's config."""
    return name[: -len(":latest")] if name.endswith(":latest") else name


@dataclass(frozen=True)
class FileFacts:
    size: int
    modified_at: str
    digest: str
    meta: dict[str, gguf_meta.Value]


def facts(path: Path) -> FileFacts:
    try:
        st = path.stat()
    except OSError:
        return FileFacts(0, "", "", {})
    return _facts(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _facts(path: Path, size: int, mtime_ns: int) -> FileFacts:
    """Cached by the file's size and time: a header is read once per version of a file."""
    try:
        meta = gguf_meta.read_metadata(path)
    except (OSError, gguf_meta.NotGGUF):
        meta = {}
    when = datetime.fromtimestamp(mtime_ns / 1e9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    digest = hashlib.sha256(f"{path}\0{size}\0{mtime_ns}".encode()).hexdigest()
    return FileFacts(size, when, digest, meta)


def details(meta: dict[str, gguf_meta.Value]) -> dict[str, Any]:
    arch = meta.get("general.architecture")
    family = arch if isinstance(arch, str) else ""
    size = meta.get("general.size_label")
    count = meta.get("general.parameter_count")
    if not isinstance(size, str):
        size = _count_label(count) if isinstance(count, int) else ""
    ftype = meta.get("general.file_type")
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": size,
        "quantization_level": _FILE_TYPES.get(ftype, "") if isinstance(ftype, int) else "",
    }


def _count_label(n: int) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}".replace(".0", "")
    return str(n)


def served_digest(h: Served, f: FileFacts) -> str:
    """One served model's digest: its name's and its file's (see above)."""
    return hashlib.sha256(f"{h.name}\0{f.digest}".encode()).hexdigest() if f.digest else ""


def context_length(h: Served) -> int:
    """The most one request may hold on this server: the loaded worker's figure, else the
    config's (a request may use every cell unless n_ctx_slot says less)."""
    ready = h.conn.ready if h.conn is not None else None
    if ready is not None:
        return ready.n_ctx_slot
    return min(h.spec.n_ctx, h.spec.n_ctx_slot or h.spec.n_ctx)


def tag_entries(h: Served, names: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The model, then each of its aliases (what a client may name it by), one digest;
    `names`: an adapter model's, served by `h`."""
    f = facts(h.spec.path)
    digest = served_digest(h, f)
    return [
        {
            "name": tagged(name), "model": tagged(name), "modified_at": f.modified_at, "size": f.size,
            "digest": digest, "details": details(f.meta),
        }
        for name in (names or (h.name, *h.spec.aliases))
    ]


def remote_tag_entry(name: str, upstream_model: str, started: int) -> dict[str, Any]:
    """A model served elsewhere, as Ollama lists its own cloud models: no file here (size
    0, no digest), the name it has there as `remote_model`."""
    when = datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "name": tagged(name), "model": tagged(name), "modified_at": when, "size": 0, "digest": "",
        "remote_model": upstream_model, "details": {**details({}), "format": ""},
    }


def capabilities(h: Served, template: str) -> list[str]:
    """What the model can do: from its worker when it is loaded; else read from its chat
    template's text (a template that mentions tools takes them; <think> reasons)."""
    if h.spec.embeddings:
        return ["embedding"]
    ready = h.conn.ready if h.conn is not None else None
    out = ["completion"]
    if ready is not None:
        tools, thinking = ready.tool_format is not None, ready.reasoning
    else:
        tools, thinking = "tools" in template, "<think>" in template
    takes = projector.modalities(h.spec.mmproj)
    vision = ready.vision if ready is not None else "vision" in takes
    audio = ready.audio if ready is not None else "audio" in takes  # Ollama's own word for it, too
    return out + (["tools"] if tools else []) + (["thinking"] if thinking else []) + (["vision"] if vision else []) + (
        ["audio"] if audio else [])


def _template(h: Served, meta: dict[str, gguf_meta.Value]) -> str:
    """The chat template the model runs with: its worker's (Jinja text, or a llama.cpp
    built-in's name), else its config's built-in, else its file's. A config's Jinja file
    is shown once the worker has read it: its path on the server is never shown."""
    ready = h.conn.ready if h.conn is not None else None
    if ready is not None and ready.chat_template:
        return ready.chat_template
    if h.spec.chat_template in BUILTIN_CHAT_TEMPLATES:
        return h.spec.chat_template
    own = meta.get("tokenizer.chat_template")
    return own if isinstance(own, str) and not h.spec.chat_template else ""


def show(h: Served, verbose: bool) -> dict[str, Any]:
    f = facts(h.spec.path)
    template = _template(h, f.meta)
    info: dict[str, Any] = {
        k: v for k, v in f.meta.items()
        if verbose or not k.startswith("tokenizer.") or not isinstance(v, (list, str)) or len(v) < 256
    }
    if not verbose:
        info.pop("tokenizer.chat_template", None)  # it is `template`
    n_ctx = context_length(h)
    arch = f.meta.get("general.architecture")
    if isinstance(arch, str):
        info[f"{arch}.context_length"] = n_ctx  # see above: the server's, not the file's
    return {
        "license": "",
        # FROM names the model, never its file: paths on the server are not shown.
        "modelfile": f"# Modelfile generated by Corral\nFROM {tagged(h.name)}\nPARAMETER num_ctx {n_ctx}\n",
        "parameters": f"num_ctx                        {n_ctx}",
        "template": template,
        "details": details(f.meta),
        "model_info": info,
        "capabilities": capabilities(h, template),
        "modified_at": f.modified_at,
    }


def ps_entry(h: Served, expires_at: float | None) -> dict[str, Any] | None:
    """A loaded model; None when it is not. `expires_at`: when it unloads if left idle
    (Unix time), None for never."""
    if h.state not in (State.READY, State.DRAINING):
        return None
    f = facts(h.spec.path)
    name = tagged(h.name)
    never = datetime(9999, 12, 31, tzinfo=timezone.utc)
    try:
        expires = datetime.fromtimestamp(expires_at, timezone.utc) if expires_at is not None else never
    except (OverflowError, ValueError, OSError):  # a keep_alive of centuries: as good as never
        expires = never
    return {
        "name": name, "model": name, "size": h.rss or f.size, "digest": served_digest(h, f),
        "details": details(f.meta), "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "size_vram": 0,
        "context_length": context_length(h),
    }
