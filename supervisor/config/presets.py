"""llama-server's models preset INI (`--models-preset`, its README's "Model presets"),
translated into Corral's TOML: `corral config import-preset FILE`.

Each section is a model (`[*]` holds what every model gets: Corral's `[model_defaults]`);
its keys are llama-server's command-line arguments without their dashes, in long or short
form or as LLAMA_ARG_* variables. Every translated key keeps a comment naming the line it
came from; a key Corral has no meaning for is kept as a comment saying so, never dropped in
silence. A preset that names a Hugging Face repository instead of a file gets a
commented-out `path`: Corral downloads nothing. Pure: text in, text out.
"""

from __future__ import annotations

import configparser
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

import tomlkit
from tomlkit.items import Table


@dataclass(frozen=True)
class _Key:
    corral: str
    convert: Callable[[str], Any]


def _bool(v: str) -> bool:
    if v.strip().lower() in ("1", "true", "on", "yes", "enabled"):
        return True
    if v.strip().lower() in ("0", "false", "off", "no", "disabled"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def _float(v: str) -> float:
    return float(v)


def _int(v: str) -> int:
    return int(v)


def _str(v: str) -> str:
    return v.strip()


def _spec_type(v: str) -> str:
    """llama-server's n-gram kinds (ngram-simple, ngram-mod, ...) are Corral's "ngram", its
    draft-simple Corral's "draft" (other draft-* kinds are refused by the config check)."""
    v = v.strip().lower()
    return "ngram" if v.startswith("ngram") else "draft" if v == "draft-simple" else v


def _mib(v: str) -> int:
    """llama-server's --cache-ram: MiB, -1 no limit (here: 1 TiB), 0 off."""
    n = int(v)
    return (1 << 40) if n < 0 else n << 20


def _words(v: str) -> list[str]:
    return [w.strip() for w in v.split(",") if w.strip()]


def _flash(v: str) -> str:
    """-fa's on/off/auto, and the truthy and falsey words llama-server also takes."""
    v = v.strip().lower()
    if v in ("auto", "-1"):
        return "auto"
    return "on" if _bool(v) else "off"


def _floats(v: str) -> list[float]:
    """--tensor-split's "3,1" or "3/1" (common/arg.cpp splits on [,/]+)."""
    return [float(x) for x in re.split(r"[,/]+", v.strip()) if x]


def _inverse(v: str) -> float:
    """--rope-scale N is rope_freq_scale 1/N."""
    return 1.0 / float(v)


# llama-server's argument (long form without dashes) -> Corral's model key.
_KEYS: dict[str, _Key] = {
    "model": _Key("path", _str),
    "ctx-size": _Key("n_ctx", _int),
    "parallel": _Key("slots", _int),
    "batch-size": _Key("n_batch", _int),
    "threads": _Key("threads", _int),
    "n-gpu-layers": _Key("n_gpu_layers", _int),
    "chat-template": _Key("chat_template", _str),
    "chat-template-file": _Key("chat_template", _str),
    "temp": _Key("temperature", _float),
    "top-k": _Key("top_k", _int),
    "top-p": _Key("top_p", _float),
    "min-p": _Key("min_p", _float),
    "repeat-penalty": _Key("repeat_penalty", _float),
    "repeat-last-n": _Key("repeat_last_n", _int),
    "presence-penalty": _Key("presence_penalty", _float),
    "frequency-penalty": _Key("frequency_penalty", _float),
    "seed": _Key("seed", _int),
    "n-predict": _Key("n_predict", _int),
    "reverse-prompt": _Key("stop", lambda v: [v]),
    "embedding": _Key("embeddings", _bool),
    "pooling": _Key("pooling", _str),
    "alias": _Key("aliases", _words),
    "tags": _Key("tags", _words),
    "swa-full": _Key("swa_full", _bool),
    "spec-type": _Key("spec_type", _spec_type),
    "spec-draft-n-max": _Key("draft_max", _int),
    "spec-draft-model": _Key("draft_model", _str),
    "spec-draft-p-min": _Key("draft_p_min", _float),
    "cache-ram": _Key("prompt_cache_bytes", _mib),
    "cram": _Key("prompt_cache_bytes", _mib),
    "load-on-startup": _Key("preload", _bool),
    "chat-template-kwargs": _Key("chat_template_kwargs", json.loads),
    # Load options (worker/protocol/load_options.py).
    "flash-attn": _Key("flash_attn", _flash),
    "cache-type-k": _Key("cache_type_k", _str),
    "cache-type-v": _Key("cache_type_v", _str),
    "mmap": _Key("mmap", _bool),
    "mlock": _Key("mlock", _bool),
    "direct-io": _Key("direct_io", _bool),
    "threads-batch": _Key("threads_batch", _int),
    "ubatch-size": _Key("n_ubatch", _int),
    "split-mode": _Key("split_mode", _str),
    "tensor-split": _Key("tensor_split", _floats),
    "main-gpu": _Key("main_gpu", _int),
    "device": _Key("devices", _words),
    "kv-offload": _Key("kv_offload", _bool),
    "op-offload": _Key("op_offload", _bool),
    "override-tensor": _Key("override_tensor", _words),
    "cpu-moe": _Key("cpu_moe", _bool),
    "n-cpu-moe": _Key("n_cpu_moe", _int),
    "rope-scaling": _Key("rope_scaling", _str),
    "rope-scale": _Key("rope_freq_scale", _inverse),
    "rope-freq-base": _Key("rope_freq_base", _float),
    "rope-freq-scale": _Key("rope_freq_scale", _float),
    "yarn-orig-ctx": _Key("yarn_orig_ctx", _int),
    "yarn-ext-factor": _Key("yarn_ext_factor", _float),
    "yarn-attn-factor": _Key("yarn_attn_factor", _float),
    "yarn-beta-slow": _Key("yarn_beta_slow", _float),
    "yarn-beta-fast": _Key("yarn_beta_fast", _float),
    "check-tensors": _Key("check_tensors", _bool),
    "override-kv": _Key("override_kv", _words),
    "repack": _Key("repack", _bool),
}
# --load-mode (llama.cpp since --mmap/--mlock/--direct-io gave way to it) -> those keys.
_LOAD_MODES = {
    "auto": {"mmap": True, "mlock": False}, "mmap": {"mmap": True, "mlock": False},
    "none": {"mmap": False, "mlock": False}, "mlock": {"mmap": False, "mlock": True},
    "mmap+mlock": {"mmap": True, "mlock": True}, "dio": {"mmap": False, "mlock": False, "direct_io": True},
}
# Other names llama-server takes for them: short forms, older names, LLAMA_ARG_* variables.
_ALIASES = {
    "m": "model", "c": "ctx-size", "np": "parallel", "b": "batch-size", "t": "threads",
    "ngl": "n-gpu-layers", "gpu-layers": "n-gpu-layers", "s": "seed", "n": "n-predict",
    "predict": "n-predict", "r": "reverse-prompt", "embeddings": "embedding", "a": "alias",
    "md": "spec-draft-model", "model-draft": "spec-draft-model", "draft-p-min": "spec-draft-p-min",
    "LLAMA_ARG_SPEC_DRAFT_MODEL": "spec-draft-model", "LLAMA_ARG_SPEC_DRAFT_P_MIN": "spec-draft-p-min",
    "LLAMA_ARG_MODEL": "model", "LLAMA_ARG_CTX_SIZE": "ctx-size", "LLAMA_ARG_N_PARALLEL": "parallel",
    "LLAMA_ARG_BATCH": "batch-size", "LLAMA_ARG_THREADS": "threads", "LLAMA_ARG_N_GPU_LAYERS": "n-gpu-layers",
    "LLAMA_ARG_CHAT_TEMPLATE": "chat-template", "LLAMA_ARG_CHAT_TEMPLATE_FILE": "chat-template-file",
    "LLAMA_ARG_N_PREDICT": "n-predict", "LLAMA_ARG_EMBEDDINGS": "embedding", "LLAMA_ARG_POOLING": "pooling",
    "LLAMA_ARG_ALIAS": "alias", "LLAMA_ARG_CHAT_TEMPLATE_KWARGS": "chat-template-kwargs",
    "fa": "flash-attn", "ctk": "cache-type-k", "ctv": "cache-type-v", "tb": "threads-batch", "ub": "ubatch-size",
    "sm": "split-mode", "ts": "tensor-split", "mg": "main-gpu", "dev": "device", "nkvo": "no-kv-offload",
    "kvo": "kv-offload", "ot": "override-tensor", "cmoe": "cpu-moe", "ncmoe": "n-cpu-moe", "nr": "no-repack",
    "dio": "direct-io", "lm": "load-mode",
    "LLAMA_ARG_FLASH_ATTN": "flash-attn", "LLAMA_ARG_CACHE_TYPE_K": "cache-type-k",
    "LLAMA_ARG_CACHE_TYPE_V": "cache-type-v", "LLAMA_ARG_MMAP": "mmap", "LLAMA_ARG_NO_MMAP": "no-mmap",
    "LLAMA_ARG_MLOCK": "mlock", "LLAMA_ARG_DIO": "direct-io", "LLAMA_ARG_LOAD_MODE": "load-mode",
    "LLAMA_ARG_UBATCH": "ubatch-size", "LLAMA_ARG_SPLIT_MODE": "split-mode", "LLAMA_ARG_TENSOR_SPLIT": "tensor-split",
    "LLAMA_ARG_MAIN_GPU": "main-gpu", "LLAMA_ARG_DEVICE": "device", "LLAMA_ARG_KV_OFFLOAD": "kv-offload",
    "LLAMA_ARG_NO_KV_OFFLOAD": "no-kv-offload", "LLAMA_ARG_OVERRIDE_TENSOR": "override-tensor",
    "LLAMA_ARG_CPU_MOE": "cpu-moe", "LLAMA_ARG_N_CPU_MOE": "n-cpu-moe", "LLAMA_ARG_ROPE_SCALING_TYPE": "rope-scaling",
    "LLAMA_ARG_ROPE_SCALE": "rope-scale", "LLAMA_ARG_ROPE_FREQ_BASE": "rope-freq-base",
    "LLAMA_ARG_ROPE_FREQ_SCALE": "rope-freq-scale", "LLAMA_ARG_YARN_ORIG_CTX": "yarn-orig-ctx",
    "LLAMA_ARG_YARN_EXT_FACTOR": "yarn-ext-factor", "LLAMA_ARG_YARN_ATTN_FACTOR": "yarn-attn-factor",
    "LLAMA_ARG_YARN_BETA_SLOW": "yarn-beta-slow", "LLAMA_ARG_YARN_BETA_FAST": "yarn-beta-fast",
    "LLAMA_ARG_REPACK": "repack", "LLAMA_ARG_NO_REPACK": "no-repack",
}
# Keys a table may not take in [model_defaults] (Corral's rule: set per model).
_PER_MODEL = ("path", "aliases")


class PresetError(ValueError):
    """The file is not an INI file llama-server would read."""


def import_preset(text: str, source: str) -> str:
    """Corral TOML for llama-server's preset `text` (read from `source`, named in the
    comments). Raises PresetError."""
    parser = configparser.ConfigParser(
        interpolation=None, strict=False, comment_prefixes=(";", "#"), inline_comment_prefixes=None,
        default_section="\0none",  # [*] is an ordinary section here, translated on its own
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    try:
        parser.read_string("[\0top]\n" + text, source)
    except configparser.Error as exc:
        raise PresetError(f"{source}: {exc}") from None
    lines = _line_numbers(text)
    doc = tomlkit.document()
    doc.add(tomlkit.comment(f"Translated from llama-server's models preset {source} by corral config import-preset."))
    models = tomlkit.table(is_super_table=True)
    for section in parser.sections():
        if section == "\0top":
            continue  # `version = 1`: nothing to translate
        table = tomlkit.table()
        for key, value in parser.items(section):
            _translate(table, key, value, f"{source}:{lines.get((section, key), '?')}", section == "*")
        if section == "*":
            doc.add("model_defaults", table)
        else:
            models.add(section, table)
    doc.add("models", models)
    return tomlkit.dumps(doc)


def _translate(table: Table, key: str, value: str, where: str, defaults: bool) -> None:
    name = _ALIASES.get(key, key)
    negated = name.startswith("no-") and name[3:] in _KEYS  # no-mmap, nkvo (no-kv-offload)
    name = name[3:] if negated else name
    if name in ("reasoning", "LLAMA_ARG_REASONING") and value.strip() in ("on", "off"):
        _put(table, "chat_template_kwargs", {"enable_thinking": value.strip() == "on"}, f"{key} = {value} ({where})")
        return
    if name == "load-mode":
        mode = _LOAD_MODES.get(value.strip())
        if mode is None:
            raise PresetError(f"{where}: {key} = {value}: must be one of {', '.join(_LOAD_MODES)}")
        for corral, v in mode.items():
            _put(table, corral, v, f"{key} = {value} ({where})")
        return
    if name in ("reranking", "rerank") and _bool(value):
        _put(table, "embeddings", True, f"{key} = {value} ({where})")
        _put(table, "pooling", "rank", f"{key} = {value} ({where})")
        return
    spec = _KEYS.get(name)
    if spec is None:
        if name in ("jinja", "LLAMA_ARG_JINJA"):
            table.add(tomlkit.comment(f"{key} = {value} ({where}): Corral renders the model's Jinja template by default"))
        elif name in ("hf-repo", "hf", "LLAMA_ARG_HF_REPO"):
            table.add(tomlkit.comment(f'path = ""  # {key} = {value} ({where}): Corral downloads nothing; name the GGUF here'))
        else:
            table.add(tomlkit.comment(f"not translated: {key} = {value} ({where}): no Corral meaning"))
        return
    if defaults and spec.corral in _PER_MODEL:
        table.add(tomlkit.comment(f"not translated: {key} = {value} ({where}): set per model"))
        return
    try:
        converted = spec.convert(value)
    except ValueError as exc:
        raise PresetError(f"{where}: {key} = {value}: {exc}") from None
    if negated and isinstance(converted, bool):
        converted = not converted
    _put(table, spec.corral, converted, f"{key} = {value} ({where})")
    if spec.corral == "n_predict" and converted > 0:
        # llama-server's -n is also the most a request may ask for (a larger n_predict is
        # cut to it): Corral's max_tokens_limit.
        _put(table, "max_tokens_limit", converted, f"{key} = {value} ({where})")


def _put(table: Table, key: str, value: Any, comment: str) -> None:
    """`key = value  # comment`; a later line wins, as llama-server reads the file."""
    if key in table:
        del table[key]
    if isinstance(value, dict):  # on its line, with its comment, not a table of its own
        inline = tomlkit.inline_table()
        inline.update(value)
        item: Any = inline
    else:
        item = tomlkit.item(value)
    item.comment(comment)
    table.add(key, item)


def _line_numbers(text: str) -> dict[tuple[str, str], int]:
    """Each (section, key)'s line in `text`, for the comments."""
    out: dict[tuple[str, str], int] = {}
    section = "\0top"
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif "=" in line and not line.startswith((";", "#")):
            out[(section, line.split("=", 1)[0].strip())] = i
    return out
