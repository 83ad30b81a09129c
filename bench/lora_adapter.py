"""Random-weight LoRA adapters (GGUF) for a base model, written with gguf-py.

No adapter for the demo model is on the package registry, so the tests, the LoRA benchmark
(bench/lora.py) and examples/lora.toml make their own. The keys and tensor names are the
ones llama.cpp's src/llama-adapter.cpp reads: `general.architecture` equal to the base's,
`general.type = "adapter"`, `adapter.type = "lora"`, `adapter.lora.alpha`, and for each
adapted weight `W` of ne [in, out] a pair `W.lora_a` of ne [in, r] and `W.lora_b` of ne
[r, out] (numpy shapes are the reverse). The tensors adapted are every block's attention
query and value and feed-forward down projections.

Deterministic: the same base, seed, rank and strength give the same bytes. `strength` sizes
B so that scale 1 changes the demo model's greedy text and a fractional scale changes it
differently (random weights at the usual LoRA init, B = 0, would change nothing).

    python -m bench.lora_adapter models/gemma-3-270m-Q4_K_M.gguf models/lora-a.gguf [--seed 1]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from bench import gguf_out

TARGETS = ("attn_q", "attn_v", "ffn_down")


def base_shapes(base: str | os.PathLike[str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """The base model's architecture, and the ne [in, out] of each weight an adapter may
    target (2-D `blk.N.<target>.weight` tensors)."""
    import gguf

    reader = gguf.GGUFReader(str(base))
    arch = str(reader.fields["general.architecture"].contents())
    shapes: dict[str, tuple[int, int]] = {}
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in TARGETS and len(t.shape) == 2:
            shapes[t.name] = (int(t.shape[0]), int(t.shape[1]))
    return arch, shapes


def write(
    base: str | os.PathLike[str],
    path: str | os.PathLike[str],
    seed: int = 1,
    rank: int = 8,
    strength: float = 0.05,
    alpha: float | None = None,
    arch: str | None = None,
    f16: bool = False,
) -> int:
    """Write an adapter for `base` to `path` (atomically); returns the weights it adapts.
    `arch` overrides the architecture written (a test's mismatched adapter)."""
    base_arch, shapes = base_shapes(base)
    rng = np.random.default_rng(seed)
    dtype = np.float16 if f16 else np.float32
    writer = gguf_out.start(path, arch or base_arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("general.name", f"corral-test-lora-{seed}")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha if alpha is not None else rank))
    for name in sorted(shapes):
        n_in, n_out = shapes[name]
        stem = name.removesuffix(".weight")
        a = rng.normal(0.0, 1.0 / np.sqrt(n_in), size=(rank, n_in))
        b = rng.normal(0.0, strength, size=(n_out, rank))
        writer.add_tensor(f"{stem}.weight.lora_a", a.astype(dtype))
        writer.add_tensor(f"{stem}.weight.lora_b", b.astype(dtype))
    gguf_out.finish(writer)
    return len(shapes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--strength", type=float, default=0.05)
    args = ap.parse_args()
    n = write(args.base, args.out, seed=args.seed, rank=args.rank, strength=args.strength)
    print(f"{args.out}: {n} weights adapted, rank {args.rank}")


if __name__ == "__main__":
    main()
