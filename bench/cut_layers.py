"""A draft model for speculative decoding, made from a model by keeping its first layers.

  python -m bench.cut_layers [--model PATH] [--layers 6] [--out PATH]

No smaller model with the demo model's vocabulary can be downloaded here, so the benchmark
and the tests make one: the same GGUF with only blocks 0 .. layers-1 (and the block count
and, where the architecture has one, the sliding-window pattern's list cut to match),
everything else (embeddings, output norm, tokenizer) as it was. Such an early-exit model
guesses the full model's next token often enough to measure a draft model's cost and gain;
with every layer kept it is the model itself, whose drafts are always taken.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.gguf_edit import first_layers

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "models" / "gemma-3-270m-Q4_K_M.gguf"


def cut(src: Path, dst: Path, layers: int, tokens: dict[int, str] | None = None) -> Path:
    """`tokens`: token texts to replace (tests: a vocabulary that differs)."""
    try:
        return first_layers(src, dst, layers, tokens)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or args.model.with_name(f"{args.model.stem}-first{args.layers}.gguf")
    print(cut(args.model, out, args.layers))


if __name__ == "__main__":
    main()
