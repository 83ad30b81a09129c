"""bench/gguf_edit.py against gguf-py, the format's reference reader and writer: a model
written by gguf-py's GGUFWriter, copied unchanged, is the same bytes; cut to its first
layers or given new values, gguf-py reads back what was asked, and every kept tensor's data
as it was."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from bench.gguf_edit import first_layers, read, with_values

TOKENS = ["<pad>", "a", "b", "\u00fcber", "\U0001f642"]


def _model(path: Path, layers: int = 4) -> Path:
    """A tiny model in gguf-py's own layout: per-layer arrays, a vocabulary, tensors of
    odd sizes (so that each is padded) in blocks and outside them."""
    w = gguf.GGUFWriter(path, arch="gemma3")
    w.add_block_count(layers)
    w.add_name("tiny")
    w.add_array("gemma3.attention.sliding_window_pattern", [i % 2 == 0 for i in range(layers)])
    w.add_array("gemma3.attention.head_count_kv", [1 + i for i in range(layers)])
    w.add_token_list(TOKENS)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)
    rng = np.random.default_rng(7)
    w.add_tensor("token_embd.weight", rng.standard_normal((5, 3)).astype(np.float32))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_q.weight", rng.standard_normal((i + 1, 7)).astype(np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", rng.standard_normal(5).astype(np.float16))
    w.add_tensor("output_norm.weight", rng.standard_normal(3).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _fields(path: Path) -> dict[str, object]:
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def _tensors(path: Path) -> dict[str, tuple[int, list[int], bytes]]:
    return {t.name: (int(t.tensor_type), [int(d) for d in t.shape], t.data.tobytes()) for t in gguf.GGUFReader(path).tensors}


def test_a_copy_without_changes_is_the_same_bytes(tmp_path: Path) -> None:
    src = _model(tmp_path / "m.gguf")
    assert with_values(src, tmp_path / "copy.gguf", {}).read_bytes() == src.read_bytes()


def test_first_layers_is_what_gguf_py_reads_with_the_rest_left_out(tmp_path: Path) -> None:
    src = _model(tmp_path / "m.gguf")
    out = first_layers(src, tmp_path / "cut.gguf", 2, tokens={3: "other"})
    before, after = _fields(src), _fields(out)
    assert after["gemma3.block_count"] == 2 and after["general.name"] == "tiny (first 2 of 4 layers)"
    assert after["gemma3.attention.sliding_window_pattern"] == [True, False]
    assert after["gemma3.attention.head_count_kv"] == [1, 2]
    assert after["tokenizer.ggml.tokens"] == ["<pad>", "a", "b", "other", "\U0001f642"]
    changed = {"gemma3.block_count", "general.name", "gemma3.attention.sliding_window_pattern",
               "gemma3.attention.head_count_kv", "tokenizer.ggml.tokens"}
    assert {k: v for k, v in after.items() if k not in changed} == {k: v for k, v in before.items() if k not in changed}
    kept = {n: t for n, t in _tensors(src).items() if not n.startswith(("blk.2.", "blk.3."))}
    assert _tensors(out) == kept


def test_new_and_changed_values_keep_every_tensor(tmp_path: Path) -> None:
    src = _model(tmp_path / "m.gguf")
    out = with_values(src, tmp_path / "v.gguf", {"tokenizer.ggml.fim_pre_token_id": 2, "tokenizer.ggml.eos_token_id": 4})
    r = gguf.GGUFReader(out)
    assert r.fields["tokenizer.ggml.fim_pre_token_id"].contents() == 2
    assert r.fields["tokenizer.ggml.fim_pre_token_id"].types == [gguf.GGUFValueType.UINT32]
    assert r.fields["tokenizer.ggml.eos_token_id"].contents() == 4
    assert _tensors(out) == _tensors(src)
    assert read(out).pairs.keys() == {*read(src).pairs, "tokenizer.ggml.fim_pre_token_id"}


def test_layers_past_the_model_are_refused(tmp_path: Path) -> None:
    src = _model(tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="1..4"):
        first_layers(src, tmp_path / "cut.gguf", 5)
