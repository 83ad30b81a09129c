"""The GGUF header reader behind the supervisor's memory estimate."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from supervisor.config.gguf_meta import (
    WORKER_BASE_BYTES, NotGGUF, estimate_bytes, kv_cache_bytes, projector_bytes, read_metadata,
)


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + payload


def write_gguf(path: Path, pairs: list[bytes], version: int = 3) -> None:
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, 0, len(pairs)) + b"".join(pairs))


def u32(key: str, v: int) -> bytes:
    return _kv(key, 4, struct.pack("<I", v))


def string(key: str, v: str) -> bytes:
    return _kv(key, 8, _s(v))


def str_array(key: str, items: list[str]) -> bytes:
    return _kv(key, 9, struct.pack("<IQ", 8, len(items)) + b"".join(_s(x) for x in items))


def i32_array(key: str, items: list[int]) -> bytes:
    return _kv(key, 9, struct.pack("<IQ", 5, len(items)) + struct.pack(f"<{len(items)}i", *items))


LLAMA = [
    string("general.architecture", "llama"),
    u32("llama.block_count", 4),
    u32("llama.embedding_length", 256),
    u32("llama.attention.head_count", 8),
    u32("llama.attention.head_count_kv", 2),
]


def test_reads_scalars_strings_and_small_arrays(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    write_gguf(p, [*LLAMA, i32_array("x.per_layer", [1, 2, 3]), str_array("tokenizer.ggml.tokens", ["a", "b"])])
    meta = read_metadata(p)
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 4
    assert meta["x.per_layer"] == [1, 2, 3]
    assert "tokenizer.ggml.tokens" not in meta  # string arrays are skipped, not kept


def test_kv_cache_from_head_counts(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    write_gguf(p, LLAMA)
    meta = read_metadata(p)
    # 4 layers x 2 kv heads x (32 + 32) dims x 2 bytes per cell.
    assert kv_cache_bytes(meta, 1000) == 1000 * 4 * 2 * 64 * 2


def test_kv_cache_with_per_layer_kv_heads_and_explicit_head_sizes(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    write_gguf(
        p,
        [
            string("general.architecture", "g"),
            u32("g.block_count", 3),
            u32("g.embedding_length", 640),
            u32("g.attention.head_count", 4),
            u32("g.attention.key_length", 256),
            u32("g.attention.value_length", 128),
            i32_array("g.attention.head_count_kv", [1, 0, 2]),
        ],
    )
    assert kv_cache_bytes(read_metadata(p), 10) == 10 * (1 + 0 + 2) * (256 + 128) * 2


def test_estimate_is_file_plus_kv_plus_base_and_stops_before_the_vocabulary(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    # A vocabulary entry with an absurd length after the needed keys: reading it would fail.
    broken_tail = _s("tokenizer.ggml.tokens") + struct.pack("<I", 8) + struct.pack("<Q", 1 << 40)
    write_gguf(p, [*LLAMA, broken_tail])
    size = p.stat().st_size
    assert estimate_bytes(p, 100) == size + 100 * 4 * 2 * 64 * 2 + WORKER_BASE_BYTES


def test_a_projector_costs_its_file_and_on_a_cpu_the_context_beside(tmp_path: Path) -> None:
    model, mmproj = tmp_path / "m.gguf", tmp_path / "mmproj.gguf"
    write_gguf(model, LLAMA)
    mmproj.write_bytes(b"\0" * 5000)
    assert projector_bytes(mmproj, model, 100) == 5000 + 100 * 4 * 2 * 64 * 2  # the model's KV for 100 cells
    assert projector_bytes(mmproj, model, 0) == 5000  # a GPU's: decoded in place


def test_a_file_that_is_not_gguf_costs_its_size(tmp_path: Path) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(b"\0" * 1000)
    assert estimate_bytes(p, 4096) == 1000
    with pytest.raises(NotGGUF):
        read_metadata(p)


@pytest.mark.parametrize("cut", [5, 12, 30, 60])
def test_a_truncated_header_is_not_gguf(tmp_path: Path, cut: int) -> None:
    p = tmp_path / "m.gguf"
    write_gguf(p, LLAMA)
    p.write_bytes(p.read_bytes()[:cut])
    with pytest.raises(NotGGUF):
        read_metadata(p)
    assert estimate_bytes(p, 10) == cut


def test_unknown_version_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    write_gguf(p, LLAMA, version=9)
    with pytest.raises(NotGGUF, match="version 9"):
        read_metadata(p)
