"""`corral config check` for a model's load options (worker/protocol/load_options.py): the
ranges llama-server's argument parser holds them to, and the combinations llama.cpp refuses
when it makes the context (src/llama-context.cpp, llama_init_from_model), said before a
worker ever starts. Pure, but for the GGUF header a K type's block size is checked against.

What only the worker can know (which GPUs and buffer types this machine's llama.cpp has) is
its LoadError, naming the option (worker/load_params.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterator

from supervisor.config import gguf_meta
from worker.protocol.load_options import (
    KV_TYPES,
    MAX_DEVICES,
    QUANTIZED_KV,
    BadOption,
    LoadOptions,
    kv_override,
    tensor_override,
)


def load_problems(at: str, o: LoadOptions, model: Path | None, embeddings: bool, n_batch: int) -> Iterator[str]:
    """Each problem with `o`, as "models.NAME.key: why"."""
    if o.cache_type_v in QUANTIZED_KV and o.flash_attn == "off":
        yield (
            f'{at}.cache_type_v: a quantized V cache ({o.cache_type_v}) needs flash attention; '
            f'flash_attn is "off" (set "auto" or "on")'
        )
    if o.split_mode == "tensor" and o.flash_attn == "off":
        yield f'{at}.split_mode: "tensor" needs flash attention; flash_attn is "off"'
    if o.direct_io and (o.mmap or o.mlock):
        yield f"{at}.direct_io: reads the file around the page cache instead of mapping it: set mmap = false, mlock = false"
    if o.threads_batch is not None and not 1 <= o.threads_batch <= 1024:
        yield f"{at}.threads_batch: must be 1..1024, got {o.threads_batch}"
    if o.n_ubatch is not None:
        if not 1 <= o.n_ubatch:
            yield f"{at}.n_ubatch: must be at least 1, got {o.n_ubatch}"
        elif embeddings:
            yield f"{at}.n_ubatch: an embedding model takes each input in one pass of n_batch tokens; set n_batch"
        elif o.n_ubatch > n_batch:
            yield f"{at}.n_ubatch: must be at most n_batch ({n_batch}), got {o.n_ubatch}"
    if len(o.tensor_split) >= MAX_DEVICES:
        yield f"{at}.tensor_split: at most {MAX_DEVICES - 1} proportions (one a GPU), got {len(o.tensor_split)}"
    if any(not math.isfinite(x) or x < 0 for x in o.tensor_split):
        yield f"{at}.tensor_split: proportions must be finite and 0 or more, got {o.tensor_split}"
    if not 0 <= o.main_gpu < MAX_DEVICES:
        yield f"{at}.main_gpu: must be 0..{MAX_DEVICES - 1}, got {o.main_gpu}"
    if "none" in o.devices and o.devices != ["none"]:
        yield f'{at}.devices: "none" (no GPU) stands alone, got {o.devices}'
    if any(not d.strip() for d in o.devices):
        yield f"{at}.devices: device names must not be empty"
    for i, entry in enumerate(o.override_tensor):
        try:
            tensor_override(entry)
        except BadOption as exc:
            yield f"{at}.override_tensor[{i}]: {exc}"
    if o.n_cpu_moe < 0:
        yield f"{at}.n_cpu_moe: must be 0 or more layers, got {o.n_cpu_moe}"
    for i, entry in enumerate(o.override_kv):
        try:
            kv_override(entry)
        except BadOption as exc:
            yield f"{at}.override_kv[{i}]: {exc}"
    yield from _rope_problems(at, o)
    if model is not None and {o.cache_type_k, o.cache_type_v} & QUANTIZED_KV:
        yield from _block_problems(at, o, model)


def _rope_problems(at: str, o: LoadOptions) -> Iterator[str]:
    for key in ("rope_freq_base", "rope_freq_scale"):
        v = getattr(o, key)
        if not math.isfinite(v) or v < 0:
            yield f"{at}.{key}: must be 0 (the model's) or more, got {v}"
    if o.yarn_orig_ctx < 0:
        yield f"{at}.yarn_orig_ctx: must be 0 (the model's) or more, got {o.yarn_orig_ctx}"
    for key in ("yarn_ext_factor", "yarn_attn_factor", "yarn_beta_slow", "yarn_beta_fast"):
        v = getattr(o, key)
        if not math.isfinite(v) or (v < 0 and v != -1.0):
            yield f"{at}.{key}: must be -1 (the model's) or 0 or more, got {v}"


def _block_problems(at: str, o: LoadOptions, model: Path) -> Iterator[str]:
    """A quantized cache stores a head's values in blocks of 32: llama.cpp refuses a type
    whose blocks do not divide the model's head size (llama_init_from_model)."""
    try:
        meta = gguf_meta.read_metadata(model, gguf_meta.has_kv_shape)
    except (gguf_meta.NotGGUF, OSError):
        return  # the path's own check says why
    if gguf_meta.uses_mla(meta) and o.cache_type_k != o.cache_type_v:
        yield (
            f"{at}.cache_type_v: this model's attention (MLA) keeps one latent cache: cache_type_k "
            f"({o.cache_type_k}) and cache_type_v ({o.cache_type_v}) must be the same"
        )
    heads = gguf_meta.head_sizes(meta)
    if heads is None:
        return
    for key, kv_type, size in (("cache_type_k", o.cache_type_k, heads[0]), ("cache_type_v", o.cache_type_v, heads[1])):
        block = KV_TYPES[kv_type][1]
        if size % block:
            yield (
                f"{at}.{key}: {kv_type} stores values in blocks of {block}, which do not divide this "
                f"model's head size ({size}); llama.cpp would refuse it"
            )
