"""How llama.cpp loads a model and makes its context: the options llama-server takes as
load-time flags, under their names there (README's load options table; issue 43).

`LoadOptions` is a base of `ModelOptions` (worker/protocol/parameters.py), so each option
is a key of a model's table, reaches the worker in its spec and is checked by `corral config
check` (supervisor/config/load_checks.py). The worker turns them into llama.cpp's parameters
in worker/load_params.py. Defaults are llama-server's, so that a model table without them
loads as `llama-server -m FILE` would.
"""

from __future__ import annotations

import re
from typing import Iterable, Literal

import msgspec

KvType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]

# A KV cache type's ggml type id (ggml.h's enum ggml_type), and the elements and bytes of
# one block of it (ggml_blck_size, ggml_type_size): what a cell's row costs at that type.
# -ctk/-ctv take exactly these names (common/arg.cpp, kv_cache_types).
KV_TYPES: dict[str, tuple[int, int, int]] = {
    "f32": (0, 1, 4),
    "f16": (1, 1, 2),
    "bf16": (30, 1, 2),
    "q8_0": (8, 32, 34),
    "q4_0": (2, 32, 18),
    "q4_1": (3, 32, 20),
    "iq4_nl": (20, 32, 18),
    "q5_0": (6, 32, 22),
    "q5_1": (7, 32, 24),
}
QUANTIZED_KV = frozenset(t for t, (_, block, _) in KV_TYPES.items() if block > 1)

# --cpu-moe's and --n-cpu-moe's patterns (common/common.h, LLM_FFN_EXPS_REGEX): a MoE
# layer's expert tensors, kept in host memory while the rest goes to the GPU.
EXPERTS_PATTERN = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
MAX_DEVICES = 16  # llama_max_devices(): tensor_split has at most 15 entries


class LoraAdapter(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A LoRA adapter GGUF loaded with the model (llama-server's --lora, --lora-scaled),
    and the scale a request gets when it names none (its own `lora`, or POST
    /lora-adapters, sets others). The worker loads the file; scales are the router's:
    each request's travel in its Generate frame (Generate.adapters)."""

    path: str
    scale: float = 1.0


# ((adapter index, scale), ...), by index, no scale 0: what one request decodes under.
AdapterSet = tuple[tuple[int, float], ...]
BASE: AdapterSet = ()


def adapter_set(pairs: Iterable[tuple[int, float]]) -> AdapterSet:
    """The set that (index, scale) pairs name: scale 0 left out (llama.cpp drops it), a
    later pair for the same index wins, ordered by index; -0.0 is 0."""
    scales: dict[int, float] = {}
    for index, scale in pairs:
        scales[index] = float(scale)
    return tuple((i, s) for i, s in sorted(scales.items()) if s != 0.0)


LORA_TURN_STEPS = 4  # see lora_turn_steps: measured best of 1, 2, 4, 8 (docs/lora.md)


class LoadOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    # Flash attention (-fa): "auto" lets llama.cpp use it where every layer's device has
    # it. A quantized V cache needs it: with "auto" llama.cpp turns it on, with "off" the
    # model cannot load (the config check says so first).
    flash_attn: Literal["on", "off", "auto"] = "auto"
    # The KV cache's element types (-ctk, -ctv). q8_0 halves the cache's memory against
    # f16, q4_0 takes 28% of it, at some cost in quality (bench/load_options.py).
    cache_type_k: KvType = "f16"
    cache_type_v: KvType = "f16"
    # How the weights are read (llama-server's --load-mode, before it --no-mmap, --mlock):
    # mapped from the file (shared with the page cache, loaded as touched) or read into
    # the worker's memory; mlock pins them so the system never swaps them out. A refused
    # mlock (RLIMIT_MEMLOCK) is a warning in the worker's log, and the model loads
    # unpinned: llama.cpp goes on, as llama-server does. direct_io reads the file around
    # the page cache (--load-mode dio), without mmap.
    mmap: bool = True
    mlock: bool = False
    direct_io: bool = False
    # Threads for prompt batches (-tb); None: as many as `threads`.
    threads_batch: int | None = None
    # The most tokens one compute pass takes (-ub); None: min(n_batch, 512).
    n_ubatch: int | None = None
    # Several GPUs (-sm, -ts, -mg, -dev): how the model is split over them ("layer":
    # whole layers to each; "row": each matrix's rows; "none": main_gpu alone), in what
    # proportions (empty: by free memory), and which devices (names as llama.cpp lists
    # them, CUDA0, Vulkan1; empty: every GPU; ["none"]: none). kv_offload = false keeps
    # the KV cache in host memory (-nkvo); op_offload = false computes host-held weights'
    # ops on the CPU (--no-op-offload).
    split_mode: Literal["none", "layer", "row", "tensor"] = "layer"
    tensor_split: list[float] = []
    main_gpu: int = 0
    devices: list[str] = []
    kv_offload: bool = True
    op_offload: bool = True
    # Tensors whose names match a pattern go to a buffer type instead (-ot), "regex=TYPE"
    # each, the first match winning: "blk\\.(1[0-9])\\.ffn_.*_exps=CPU". cpu_moe keeps
    # every MoE layer's experts in host memory (--cpu-moe), n_cpu_moe the first N layers'
    # (--n-cpu-moe): how a 30B MoE fits a consumer GPU.
    override_tensor: list[str] = []
    cpu_moe: bool = False
    n_cpu_moe: int = 0
    # RoPE context extension (--rope-scaling, --rope-freq-base, --rope-freq-scale,
    # --yarn-*). None, 0 and -1 mean "as the model's file says".
    rope_scaling: Literal["none", "linear", "yarn"] | None = None
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_orig_ctx: int = 0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_beta_fast: float = -1.0
    # Validate every tensor's data while loading (--check-tensors): slower loads, and a
    # corrupt file fails to load instead of answering garbage.
    check_tensors: bool = False
    # Metadata overrides (--override-kv), "key=type:value" with type int, float, bool or
    # str: "tokenizer.ggml.add_bos_token=bool:false".
    override_kv: list[str] = []
    # LoRA adapters (supervisor/config/lora.py): the config's relative paths, absolute in
    # the resolved spec; a base model's spec lists its own first, then those of the adapter
    # models (`base = NAME`) it serves, each once.
    lora: list[LoraAdapter] = []
    # Steps an adapter set keeps the batch, while requests of several sets run, before
    # another set's turn (worker/adapter_turns.py): longer turns pay the graph reservation
    # a change of set costs less often; shorter ones keep each set's tokens coming more
    # evenly. Shares stay weighted by requests either way.
    lora_turn_steps: int = LORA_TURN_STEPS


# The options a KV cell's bytes depend on: a saved prompt (worker/prompt_store.py) is read
# back only into a context made with the same.
CELL_OPTIONS = (
    "flash_attn", "cache_type_k", "cache_type_v", "rope_scaling", "rope_freq_base", "rope_freq_scale",
    "yarn_orig_ctx", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_slow", "yarn_beta_fast", "override_kv",
)


def load_mode(o: LoadOptions) -> int:
    """llama.cpp's enum llama_load_mode for mmap, mlock and direct_io (include/llama.h):
    AUTO maps where every device can (a default mmap = true), NONE reads, MLOCK pins what
    was read, MMAP_MLOCK pins the mapping, DIRECT_IO reads around the page cache."""
    if o.direct_io:
        return 4
    if o.mlock:
        return 3 if o.mmap else 2
    return -1 if o.mmap else 0


def kv_row_bytes(kv_type: str, elements: int) -> int:
    """Bytes of one cell's row of `elements` values at `kv_type`."""
    _, block, size = KV_TYPES[kv_type]
    return -(-elements // block) * size


class BadOption(ValueError):
    """An option's value llama.cpp would refuse; the message names what is wrong."""


def tensor_override(entry: str) -> tuple[str, str]:
    """`override_tensor`'s "regex=TYPE" as (regex, buffer type name), split at the last
    "=" (a pattern may hold one; a buffer type's name never does). The pattern is
    compiled by Python first: llama.cpp's std::regex throws on a bad one mid-load."""
    pattern, eq, buffer = entry.rpartition("=")
    if not eq or not pattern or not buffer.strip():
        raise BadOption(f"{entry!r} is not \"PATTERN=BUFFER_TYPE\" (e.g. \"\\\\.ffn_.*_exps=CPU\")")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise BadOption(f"{pattern!r} is not a regular expression: {exc}") from None
    return pattern, buffer.strip()


def tensor_overrides(o: LoadOptions) -> list[tuple[str, str]]:
    """Every (pattern, buffer type) the model loads with, in the order llama.cpp tries
    them (the first match wins): override_tensor's own, then n_cpu_moe's and cpu_moe's,
    as llama-server adds them after -ot. Raises BadOption."""
    out = [tensor_override(e) for e in o.override_tensor]
    out += [(rf"blk\.{i}{EXPERTS_PATTERN}", "CPU") for i in range(o.n_cpu_moe)]
    if o.cpu_moe:
        out.append((EXPERTS_PATTERN, "CPU"))
    return out


KV_OVERRIDE_TAGS = {"int": 0, "float": 1, "bool": 2, "str": 3}  # llama_model_kv_override_type


def kv_override(entry: str) -> tuple[str, int, int | float | bool | str]:
    """`override_kv`'s "key=type:value" as (key, llama.cpp's type tag, value), checked
    as common.cpp's string_parse_kv_override does: a key and a str value under 128 bytes
    (fixed arrays in llama_model_kv_override), bool only true or false."""
    key, eq, typed = entry.partition("=")
    kind, colon, text = typed.partition(":")
    if not eq or not colon or not key:
        raise BadOption(f"{entry!r} is not \"KEY=TYPE:VALUE\" (e.g. \"tokenizer.ggml.add_bos_token=bool:false\")")
    if len(key.encode()) >= 128:
        raise BadOption(f"key {key[:40]!r}... is longer than llama.cpp's 127 bytes")
    value: int | float | bool | str
    try:
        if kind == "int":
            value = int(text)
            if not -(2**63) <= value < 2**63:
                raise ValueError("out of a 64-bit integer's range")
        elif kind == "float":
            value = float(text)
        elif kind == "bool":
            if text not in ("true", "false"):
                raise ValueError("must be true or false")
            value = text == "true"
        elif kind == "str":
            if len(text.encode()) >= 128 or "\0" in text:
                raise ValueError("must be under 128 bytes, with no NUL")
            value = text
        else:
            raise BadOption(f"{entry!r}: type must be int, float, bool or str, got {kind!r}")
    except ValueError as exc:
        if isinstance(exc, BadOption):
            raise
        raise BadOption(f"{entry!r}: {exc}") from None
    return key, KV_OVERRIDE_TAGS[kind], value
