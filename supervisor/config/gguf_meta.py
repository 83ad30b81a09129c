"""Just enough of a GGUF file's header to estimate what a model costs before it loads.

The supervisor must not import llama_cpp, and the `gguf` package pulls in requests, tqdm and
PyYAML to read what is a few dozen lines of format. Reading stops as soon as the keys it
needs have been seen, so a 262k-token vocabulary array later in the header costs nothing.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from worker.protocol.load_options import kv_row_bytes

GGUF_MAGIC = b"GGUF"
# value type id -> struct format of one scalar (bench/gguf_edit.py reads them too)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
_MAX_SMALL_ARRAY = 4096  # per-layer arrays are kept; vocabularies are skipped

Value = int | float | bool | str | list[int | float | bool]


class NotGGUF(ValueError):
    pass


def _read(f: BinaryIO, fmt: str) -> tuple[object, ...]:
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise NotGGUF("truncated header")
    return struct.unpack("<" + fmt, data)


def _string(f: BinaryIO) -> str:
    (n,) = _read(f, "Q")
    assert isinstance(n, int)
    if n > 1 << 24:
        raise NotGGUF("implausible string length")
    data = f.read(n)
    if len(data) != n:
        raise NotGGUF("truncated header")
    return data.decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int) -> Value | None:
    if vtype in SCALARS:
        (v,) = _read(f, SCALARS[vtype])
        assert isinstance(v, (int, float, bool))
        return v
    if vtype == STRING:
        return _string(f)
    if vtype == ARRAY:
        etype, count = _read(f, "IQ")
        assert isinstance(etype, int) and isinstance(count, int)
        if etype in SCALARS:
            size = struct.calcsize("<" + SCALARS[etype])
            if count > _MAX_SMALL_ARRAY:
                f.seek(size * count, 1)
                return None
            return list(_read(f, SCALARS[etype] * count))  # type: ignore[arg-type]
        for _ in range(count):  # arrays of strings (a vocabulary) or nested arrays: skip
            if etype == STRING:
                (n,) = _read(f, "Q")
                assert isinstance(n, int)
                f.seek(n, 1)  # past the end is caught by the caller's size check
            else:
                _value(f, etype)
        return None
    raise NotGGUF(f"unknown value type {vtype}")


def read_metadata(
    path: Path, enough: Callable[[dict[str, Value]], bool] | None = None
) -> dict[str, Value]:
    """The header's key/value pairs (long arrays left out). With `enough`, stop as soon as
    it says the pairs read so far suffice. Raises NotGGUF or OSError."""
    out: dict[str, Value] = {}
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise NotGGUF("no GGUF magic")
        version, _tensors, n_kv = _read(f, "IQQ")
        if version not in (2, 3):
            raise NotGGUF(f"unsupported GGUF version {version}")
        assert isinstance(n_kv, int)
        for _ in range(n_kv):
            key = _string(f)
            (vtype,) = _read(f, "I")
            assert isinstance(vtype, int)
            v = _value(f, vtype)
            if v is not None:
                out[key] = v
            if enough is not None and enough(out):
                break
    return out


# ggml type id -> (elements per block, bytes per block), as libggml-base's ggml_blck_size
# and ggml_type_size give them (tests/unit/supervisor/config/test_gguf_check.py compares every entry).
_BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
    21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4),
    27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66),
    39: (32, 17), 40: (64, 36), 41: (128, 18), 42: (64, 18),
}
_LIMIT = 1 << 24  # more tensors or header pairs than any model has: a corrupt count


@dataclass(frozen=True)
class Unloadable:
    """A model file that no retry can load: missing, not a GGUF file, or cut short."""

    path: Path
    reason: str  # without the path, for clients: "no such file", "truncated: ..."

    def __str__(self) -> str:  # with the path, for the config check and the log
        return f"no such file: {self.path}" if self.reason == "no such file" else f"{self.path}: {self.reason}"


def problem(path: Path) -> Unloadable | None:
    """Why `path` cannot load whatever is retried, or None. Reads the whole header and
    every tensor's place, and checks that the file is long enough to hold the last
    tensor's data, as llama.cpp's loader will."""
    try:
        st = path.stat()
        reason = _problem_of_version(path, st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        reason = "no such file"
    except IsADirectoryError:
        reason = "a folder, not a GGUF model file"
    except NotGGUF as exc:
        reason = f"not a GGUF model file ({exc})"
    except OSError as exc:
        reason = f"cannot be read ({exc.strerror})"
    return None if reason is None else Unloadable(path, reason)


# Every check and every reload reads each model's header (0.2 s for a 262k-token
# vocabulary): a file that has not changed since is not read again.
@functools.lru_cache(maxsize=256)
def _problem_of_version(path: Path, size: int, mtime_ns: int) -> str | None:
    with open(path, "rb") as f:
        return _whole(f, size)


def tensor_bytes(path: Path) -> dict[str, int]:
    """Each tensor's bytes, by name, from the header's tensor table (what llama.cpp places
    layer by layer: supervisor/gpu_memory.py). Empty when a tensor's type is newer than
    this table knows. Raises NotGGUF or OSError."""
    st = path.stat()
    return dict(_tensors_of_version(path, st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _tensors_of_version(path: Path, size: int, mtime_ns: int) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    with open(path, "rb") as f:
        _whole(f, size, out)
    return tuple(out)


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's ne (ggml's order: the innermost dimension first), by name, from the
    header's tensor table: what an adapter's shapes are checked against. Raises NotGGUF or
    OSError."""
    st = path.stat()
    return dict(_shapes_of_version(path, st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _shapes_of_version(path: Path, size: int, mtime_ns: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    shapes: list[tuple[str, tuple[int, ...]]] = []
    with open(path, "rb") as f:
        _whole(f, size, shapes=shapes)
    return tuple(shapes)


def _whole(
    f: BinaryIO, size: int, tensors: list[tuple[str, int]] | None = None,
    shapes: list[tuple[str, tuple[int, ...]]] | None = None,
) -> str | None:
    if f.read(4) != GGUF_MAGIC:
        raise NotGGUF("no GGUF magic")
    version, n_tensors, n_kv = _read(f, "IQQ")
    assert isinstance(n_tensors, int) and isinstance(n_kv, int)
    if version not in (2, 3):
        raise NotGGUF(f"unsupported GGUF version {version}")
    if n_tensors > _LIMIT or n_kv > _LIMIT:
        raise NotGGUF("implausible header counts")
    alignment = 32
    for _ in range(n_kv):
        key = _string(f)
        (vtype,) = _read(f, "I")
        assert isinstance(vtype, int)
        v = _value(f, vtype)
        if key == "general.alignment" and isinstance(v, int) and v > 0:
            alignment = v
        if f.tell() > size:
            raise NotGGUF("truncated header")
    end = 0
    for _ in range(n_tensors):
        name = _string(f)
        (n_dims,) = _read(f, "I")
        assert isinstance(n_dims, int)
        if n_dims > 8:
            raise NotGGUF("implausible tensor shape")
        dims = _read(f, "Q" * n_dims) if n_dims else ()
        if shapes is not None:
            shapes.append((name, tuple(int(d) for d in dims)))  # type: ignore[call-overload]
        ttype, offset = _read(f, "IQ")
        assert isinstance(ttype, int) and isinstance(offset, int)
        if ttype not in _BLOCKS:
            if tensors is not None:
                tensors.clear()
            if shapes is None:
                return None  # a type newer than this table: let llama.cpp judge the rest
            continue  # (its shape is read all the same)
        elements = math.prod(int(d) for d in dims)  # type: ignore[call-overload]
        per_block, block_bytes = _BLOCKS[ttype]
        end = max(end, offset + elements // per_block * block_bytes)
        if tensors is not None:
            tensors.append((name, elements // per_block * block_bytes))
    data_start = -(-f.tell() // alignment) * alignment
    if f.tell() > size or (n_tensors and data_start + end > size):
        return f"truncated: {size:,} bytes where its header describes {data_start + end:,}"
    return None


def head_sizes(meta: dict[str, Value]) -> tuple[int, int] | None:
    """A KV head's K and V sizes (key_length, value_length, else the embedding over the
    heads), or None when the header does not say."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return None
    embd, heads = _num(meta, arch, "embedding_length"), _num(meta, arch, "attention.head_count")
    if not embd or not heads:
        return None
    return (_num(meta, arch, "attention.key_length") or embd // heads, _num(meta, arch, "attention.value_length") or embd // heads)


def uses_mla(meta: dict[str, Value]) -> bool:
    """Multi-head latent attention (DeepSeek 2/3, Kimi): one latent cache whose K and V
    llama.cpp requires at one type."""
    arch = meta.get("general.architecture")
    return isinstance(arch, str) and bool(_num(meta, arch, "attention.kv_lora_rank"))


def _num(meta: dict[str, Value], arch: str, key: str) -> int | None:
    v = meta.get(f"{arch}.{key}")
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def kv_cache_bytes(meta: dict[str, Value], n_ctx: int, type_k: str = "f16", type_v: str = "f16") -> int:
    """The K and V cache for `n_ctx` cells at their types (cache_type_k, cache_type_v),
    from the architecture's layer count, KV heads and head sizes. 0 when the header does
    not say."""
    return sum(kv_layer_bytes(meta, n_ctx, type_k, type_v))


def kv_layer_bytes(meta: dict[str, Value], n_ctx: int, type_k: str = "f16", type_v: str = "f16") -> list[int]:
    """kv_cache_bytes layer by layer (each layer's cache sits on its layer's device)."""
    arch = meta.get("general.architecture")
    sizes = head_sizes(meta)
    if not isinstance(arch, str) or sizes is None:
        return []
    layers, heads = _num(meta, arch, "block_count"), _num(meta, arch, "attention.head_count")
    if not layers or not heads:
        return []
    kv_heads: list[int]
    raw = meta.get(f"{arch}.attention.head_count_kv")
    if isinstance(raw, list):
        kv_heads = [int(x) for x in raw][:layers]
    else:
        kv_heads = [int(raw) if isinstance(raw, (int, float)) else heads] * layers
    k, v = sizes
    # A cell's row in a layer is its KV heads' values side by side, quantized as one row.
    return [n_ctx * (kv_row_bytes(type_k, h * k) + kv_row_bytes(type_v, h * v)) if h else 0 for h in kv_heads]


def has_kv_shape(meta: dict[str, Value]) -> bool:
    """True once the keys kv_cache_bytes needs are in. Converters write the architecture's
    keys before the tokenizer's, so this usually stops before the vocabulary; head sizes
    are optional (they default from the embedding), but a file that has them lists them
    with the others, before head_count_kv."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return False
    return all(
        f"{arch}.{k}" in meta
        for k in ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv")
    )


# What a worker holds besides weights and KV cache: the interpreter, llama.cpp's libraries,
# compute and output buffers. Measured with the demo model: RSS 372 MiB against 277 MiB of
# file and KV cache (tests/e2e/test_worker_model.py checks the estimate stays near RSS).
WORKER_BASE_BYTES = 96 * 1024 * 1024


# What a generating worker builds at load for structured output: llguidance's view of the
# vocabulary, measured at 111 MiB for gemma-3's 262,144 tokens (about 440 bytes a token).
# The vocabulary's size is not read here (its array comes after the keys this reads, and
# skipping 262k strings costs a read each), so the largest common vocabulary's is assumed.
VOCABULARY_BYTES = 112 * 1024 * 1024


def projector_bytes(mmproj: Path, model: Path, n_ctx_beside: int, kv_types: tuple[str, str] = ("f16", "f16")) -> int:
    """A projector's share of a worker's memory: its file, and on a CPU the context its
    images are decoded in beside the engine (worker/media/beside.py), a KV cache of the
    model's for `n_ctx_beside` cells at the model's KV types (0 on a GPU, where images are
    decoded in place)."""
    size = mmproj.stat().st_size
    if n_ctx_beside <= 0:
        return size
    try:
        return size + kv_cache_bytes(read_metadata(model, has_kv_shape), n_ctx_beside, *kv_types)
    except (NotGGUF, OSError):
        return size


def draft_bytes(path: Path, n_ctx: int) -> int:
    """A draft model's share of a worker's memory: its file and its KV cache."""
    size = path.stat().st_size
    try:
        return size + kv_cache_bytes(read_metadata(path, has_kv_shape), n_ctx)
    except (NotGGUF, OSError):
        return size


def estimate_bytes(
    path: Path, n_ctx: int, generates: bool = False, kv_types: tuple[str, str] = ("f16", "f16")
) -> int:
    """A model's memory before it has ever loaded: the file (weights are mapped and all
    touched), its KV cache at its types (cache_type_k, cache_type_v) and a worker's fixed
    overhead, and for a model that generates
    (not an embedding model) the structured-output vocabulary. A file that is not GGUF
    counts its size alone."""
    size = path.stat().st_size
    try:
        meta = read_metadata(path, has_kv_shape)
    except (NotGGUF, OSError):
        return size
    return size + kv_cache_bytes(meta, n_ctx, *kv_types) + WORKER_BASE_BYTES + (VOCABULARY_BYTES if generates else 0)
