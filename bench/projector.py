"""Random-weight vision projectors (mmproj GGUFs) for the demo model, written with gguf-py.

No vision GGUF is on the package registry, so the tests, `make serve-vision` and the image
benchmark make their own: a `gemma3` projector, the kind Gemma 3 4B and up ship, whose keys
and tensor names are the ones llama.cpp's tools/mtmd/clip.cpp reads (load_hparams and
load_tensors, PROJECTOR_TYPE_GEMMA3; the graph is models/siglip.cpp). Its answers mean
nothing; what it gives is the real path: Pillow's pixels into clip.cpp's preprocessing, a
vision tower, an average pool, the soft-embedding norm and the projection into the text
model's 640-wide embeddings, decoded non-causally into the request's sequence.

Two sizes:
- `tiny` (the tests): 64-pixel images, 8-pixel patches, a 64-wide 2-block tower, pooled
  2x2 (`clip.vision.projector.scale_factor`) to 16 image tokens, about 0.5 MB;
- `siglip` (the stall benchmark, never in CI): SigLIP-400M's shapes (896 px, patch 14,
  1152 wide, 27 blocks, ffn 4304, pooled 4x4 to 256 tokens), about 1.6 GB in F16.

Deterministic: the same size and seed give the same bytes. `scale` multiplies the projection,
so that different images change the greedy text and not only the logits (random weights at
the usual scale give image embeddings too small to move a 270M model's choice).

    python -m bench.projector models/mmproj-test.gguf [--size tiny|siglip] [--width 640]
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import gguf_out


@dataclass(frozen=True)
class Shape:
    image_size: int
    patch_size: int
    hidden: int  # the tower's width
    ffn: int  # must differ from `hidden`: clip.cpp swaps ffn_up/ffn_down when they are equal
    blocks: int
    heads: int
    pool: int  # clip.vision.projector.scale_factor: image tokens = (image / patch / pool)^2
    dtype: type = np.float32

    @property
    def tokens(self) -> int:
        side = self.image_size // self.patch_size // self.pool
        return side * side


SIZES = {
    "tiny": Shape(image_size=64, patch_size=8, hidden=64, ffn=96, blocks=2, heads=4, pool=2),
    "siglip": Shape(image_size=896, patch_size=14, hidden=1152, ffn=4304, blocks=27, heads=16, pool=4, dtype=np.float16),
}


def write(path: str | os.PathLike[str], size: str = "tiny", width: int = 640, seed: int = 0, scale: float = 30.0) -> Shape:
    """Write a `gemma3` projector for a text model `width` wide to `path` (atomically)."""
    s = SIZES[size]
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float = 0.02, dtype: type | None = None) -> np.ndarray:
        """A weight; matrices in the size's type (F16 for siglip, as ggml-org's projectors
        ship them), what is added to F32 activations in F32 (ggml's CPU add takes no F16
        operand: a F16 position embedding aborts the encode)."""
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(dtype or s.dtype)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    n_patches = (s.image_size // s.patch_size) ** 2
    writer = gguf_out.start(path, "clip")
    writer.add_string("general.name", f"corral-test-projector-{size}")
    writer.add_string("clip.projector_type", "gemma3")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", s.image_size)
    writer.add_uint32("clip.vision.patch_size", s.patch_size)
    writer.add_uint32("clip.vision.embedding_length", s.hidden)
    writer.add_uint32("clip.vision.feed_forward_length", s.ffn)
    writer.add_uint32("clip.vision.block_count", s.blocks)
    writer.add_uint32("clip.vision.projection_dim", width)
    writer.add_uint32("clip.vision.attention.head_count", s.heads)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.projector.scale_factor", s.pool)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    # ggml's dimensions are numpy's reversed: a [in, out] ggml matrix is (out, in) here.
    writer.add_tensor("v.patch_embd.weight", w(s.hidden, 3, s.patch_size, s.patch_size, std=0.1))
    writer.add_tensor("v.patch_embd.bias", zeros(s.hidden))
    writer.add_tensor("v.position_embd.weight", w(n_patches, s.hidden, dtype=np.float32))
    for i in range(s.blocks):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"v.blk.{i}.{name}.weight", w(s.hidden, s.hidden))
            writer.add_tensor(f"v.blk.{i}.{name}.bias", zeros(s.hidden))
        writer.add_tensor(f"v.blk.{i}.ffn_up.weight", w(s.ffn, s.hidden))
        writer.add_tensor(f"v.blk.{i}.ffn_up.bias", zeros(s.ffn))
        writer.add_tensor(f"v.blk.{i}.ffn_down.weight", w(s.hidden, s.ffn))
        writer.add_tensor(f"v.blk.{i}.ffn_down.bias", zeros(s.hidden))
        for ln in ("ln1", "ln2"):
            writer.add_tensor(f"v.blk.{i}.{ln}.weight", ones(s.hidden))
            writer.add_tensor(f"v.blk.{i}.{ln}.bias", zeros(s.hidden))
    writer.add_tensor("v.post_ln.weight", ones(s.hidden))
    writer.add_tensor("v.post_ln.bias", zeros(s.hidden))
    # models/siglip.cpp: rms_norm, times the soft-embedding norm, then the input projection
    # transposed: a (vision width, text width) matrix here.
    writer.add_tensor("mm.soft_emb_norm.weight", ones(s.hidden))
    writer.add_tensor("mm.input_projection.weight", w(s.hidden, width, std=0.02 * scale))
    gguf_out.finish(writer)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--width", type=int, default=640, help="the text model's embedding width")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=30.0)
    a = ap.parse_args()
    s = write(a.out, a.size, a.width, a.seed, a.scale)
    print(f"{a.out}: gemma3 projector, {s.image_size} px images -> {s.tokens} tokens")


if __name__ == "__main__":
    main()
