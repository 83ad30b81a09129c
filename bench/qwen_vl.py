"""A tiny random-weight Qwen2-VL pair for the M-RoPE tests, written with gguf-py: a `qwen2vl`
text model (its rope type is M-RoPE, so libmtmd places an image's tokens on a grid) and a
`qwen2vl_merger` (or `qwen2.5vl_merger`) projector that mtmd_init_from_file accepts with it.
No such model is on the package registry; the keys and tensor names are the ones llama.cpp
reads (src/models/qwen2vl.cpp; tools/mtmd/clip.cpp and models/qwen2vl.cpp). All F32,
deterministic (seeded), under 0.5 MB each; their answers mean nothing.

Text model: 2 layers, n_embd 64, 4 heads (head 16, n_rot 16), 2 KV heads, ffn 128, rope
sections [2, 3, 3, 0] (they must sum to n_rot / 2). Tokenizer: gpt2-type byte-level BPE, the
256 byte tokens in GPT-2's byte-to-unicode alphabet, 3 merges, and Qwen's specials
(<|vision_start|>, <|vision_end|>, ... as CONTROL).

Projector: patch 4, 1 block (2 for 2.5, whose window pattern needs one of each), width 32,
2 heads, 2x2 spatial merge, merger 128 -> 128 -> 64. A 32x24 image -> 8x6 patches -> 4x3 = 12
image tokens on 4 positions (nx 4, ny 3: n_pos = max(4, 3)).

    python -m bench.qwen_vl DIR   (writes qwen2vl-tiny.gguf and mmproj-qwen2vl-tiny.gguf)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import gguf  # a test and bench dependency, not the server's
import numpy as np

from bench import gguf_out

# --- text model shape
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_LAYER = 2
N_CTX = 1024
HEAD = N_EMBD // N_HEAD  # 16 = n_rot
SECTIONS = [2, 3, 3, 0]  # sum = n_rot / 2 = 8
assert sum(SECTIONS) == HEAD // 2

# --- projector shape
V_PATCH = 4
V_EMBD = 32
V_HEAD = 2
V_FF = 48  # must differ from V_EMBD (clip.cpp swaps up/down when ffn_down's ne[0] == n_embd)
V_BLOCKS = 1
V_MERGE = 2
V_IMAGE = 32  # clip.vision.image_size (required; the dyn-size preprocessor ignores it)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>"]
MERGES = [("t", "e"), ("x", "t"), ("Ġ", "t")]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def vocab() -> tuple[list[str], list[int], list[str]]:
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    types = [gguf.TokenType.NORMAL] * 256
    for a, b in MERGES:
        tokens.append(a + b)
        types.append(gguf.TokenType.NORMAL)
    for s in SPECIALS:
        tokens.append(s)
        types.append(gguf.TokenType.CONTROL)
    merges = [f"{a} {b}" for a, b in MERGES]
    return tokens, [int(t) for t in types], merges


def write_text(path: str | os.PathLike[str], seed: int = 0) -> int:
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    tokens, types, merges = vocab()
    n_vocab = len(tokens)
    wr = gguf_out.start(path, "qwen2vl")
    wr.add_name("mrope-test-text")
    wr.add_context_length(N_CTX)
    wr.add_embedding_length(N_EMBD)
    wr.add_block_count(N_LAYER)
    wr.add_feed_forward_length(N_FF)
    wr.add_head_count(N_HEAD)
    wr.add_head_count_kv(N_HEAD_KV)
    wr.add_layer_norm_rms_eps(1e-6)
    wr.add_rope_freq_base(10000.0)
    wr.add_rope_dimension_sections(SECTIONS)  # qwen2vl.rope.dimension_sections (required)
    wr.add_file_type(gguf.LlamaFileType.ALL_F32)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("qwen2")
    wr.add_token_list(tokens)
    wr.add_token_types(types)
    wr.add_token_merges(merges)
    eot = tokens.index("<|endoftext|>")
    wr.add_eos_token_id(tokens.index("<|im_end|>"))
    wr.add_bos_token_id(eot)
    wr.add_pad_token_id(eot)
    wr.add_add_bos_token(False)
    # numpy shapes are ggml's reversed: a ggml [in, out] matrix is (out, in) here
    n_kv = HEAD * N_HEAD_KV
    wr.add_tensor("token_embd.weight", w(n_vocab, N_EMBD, std=1.0))
    wr.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    wr.add_tensor("output.weight", w(n_vocab, N_EMBD, std=0.3))
    for i in range(N_LAYER):
        wr.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        wr.add_tensor(f"blk.{i}.attn_q.weight", w(N_EMBD, N_EMBD, std=0.3))
        wr.add_tensor(f"blk.{i}.attn_q.bias", w(N_EMBD, std=0.1))
        wr.add_tensor(f"blk.{i}.attn_k.weight", w(n_kv, N_EMBD, std=0.3))
        wr.add_tensor(f"blk.{i}.attn_k.bias", w(n_kv, std=0.1))
        wr.add_tensor(f"blk.{i}.attn_v.weight", w(n_kv, N_EMBD, std=0.3))
        wr.add_tensor(f"blk.{i}.attn_v.bias", w(n_kv, std=0.1))
        wr.add_tensor(f"blk.{i}.attn_output.weight", w(N_EMBD, N_EMBD, std=0.15))
        wr.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        wr.add_tensor(f"blk.{i}.ffn_gate.weight", w(N_FF, N_EMBD, std=0.15))
        wr.add_tensor(f"blk.{i}.ffn_up.weight", w(N_FF, N_EMBD, std=0.15))
        wr.add_tensor(f"blk.{i}.ffn_down.weight", w(N_EMBD, N_FF, std=0.15))
    gguf_out.finish(wr)
    return n_vocab


def write_projector(path: str | os.PathLike[str], seed: int = 1, width: int = N_EMBD, kind: str = "qwen2vl_merger") -> None:
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    wr = gguf_out.start(path, "clip")
    wr.add_string("general.name", "mrope-test-projector")
    wr.add_string("clip.projector_type", kind)
    wr.add_bool("clip.has_vision_encoder", True)
    wr.add_uint32("clip.vision.image_size", V_IMAGE)
    wr.add_uint32("clip.vision.patch_size", V_PATCH)
    wr.add_uint32("clip.vision.embedding_length", V_EMBD)
    wr.add_uint32("clip.vision.feed_forward_length", V_FF)
    wr.add_uint32("clip.vision.block_count", 2 if kind == "qwen2.5vl_merger" else V_BLOCKS)
    wr.add_uint32("clip.vision.projection_dim", width)
    wr.add_uint32("clip.vision.attention.head_count", V_HEAD)
    wr.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    wr.add_uint32("clip.vision.spatial_merge_size", V_MERGE)
    blocks = V_BLOCKS
    if kind == "qwen2.5vl_merger":
        # required for 2.5 only: every n-th layer has full attention, the others windowed. With 1
        # (all full) clip.cpp aborts setting the unused window_mask input, so: 2 blocks, pattern 2.
        blocks = 2
        wr.add_uint32("clip.vision.n_wa_pattern", 2)
    wr.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    wr.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    # two conv kernels (Qwen2-VL's temporal patch of 2 split in two), ggml [p, p, 3, C] -> numpy (C, 3, p, p)
    wr.add_tensor("v.patch_embd.weight", w(V_EMBD, 3, V_PATCH, V_PATCH, std=0.2))
    wr.add_tensor("v.patch_embd.weight.1", w(V_EMBD, 3, V_PATCH, V_PATCH, std=0.2))
    for i in range(blocks):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            wr.add_tensor(f"v.blk.{i}.{name}.weight", w(V_EMBD, V_EMBD, std=0.2))
            wr.add_tensor(f"v.blk.{i}.{name}.bias", zeros(V_EMBD))
        wr.add_tensor(f"v.blk.{i}.ffn_up.weight", w(V_FF, V_EMBD, std=0.2))
        wr.add_tensor(f"v.blk.{i}.ffn_up.bias", zeros(V_FF))
        wr.add_tensor(f"v.blk.{i}.ffn_down.weight", w(V_EMBD, V_FF, std=0.2))
        wr.add_tensor(f"v.blk.{i}.ffn_down.bias", zeros(V_EMBD))
        for ln in ("ln1", "ln2"):
            wr.add_tensor(f"v.blk.{i}.{ln}.weight", ones(V_EMBD))
            wr.add_tensor(f"v.blk.{i}.{ln}.bias", zeros(V_EMBD))
    wr.add_tensor("v.post_ln.weight", ones(V_EMBD))
    wr.add_tensor("v.post_ln.bias", zeros(V_EMBD))
    # merger: 2x2 patches concatenated (4*V_EMBD) -> mm.0 -> GELU -> mm.2 -> text width
    wr.add_tensor("mm.0.weight", w(4 * V_EMBD, 4 * V_EMBD, std=0.2))
    wr.add_tensor("mm.0.bias", zeros(4 * V_EMBD))
    wr.add_tensor("mm.2.weight", w(width, 4 * V_EMBD, std=0.5))
    wr.add_tensor("mm.2.bias", zeros(width))
    gguf_out.finish(wr)


def write_pair(folder: str | os.PathLike[str], kind: str = "qwen2vl_merger") -> tuple[Path, Path]:
    """The text model and a projector for it in `folder`: their paths."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    text, proj = out / "qwen2vl-tiny.gguf", out / f"mmproj-{kind.split('_')[0].replace('.', '')}-tiny.gguf"
    write_text(text)
    write_projector(proj, kind=kind)
    return text, proj


def main() -> None:
    for p in write_pair(sys.argv[1] if len(sys.argv) > 1 else "models"):
        print(f"{p}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
