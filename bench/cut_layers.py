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
import re
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "models" / "gemma-3-270m-Q4_K_M.gguf"


def cut(src: Path, dst: Path, layers: int, tokens: dict[int, str] | None = None) -> Path:
    """`tokens`: token texts to replace (tests: a vocabulary that differs)."""
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    block_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    total = int(reader.fields[block_key].contents())
    if not 1 <= layers <= total:
        raise SystemExit(f"--layers must be 1..{total}")
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == block_key:
            value = layers
        elif field.name == gguf.Keys.General.NAME:
            value = f"{value} (first {layers} of {total} layers)"
        elif field.name == gguf.Keys.Tokenizer.LIST and tokens:
            value = [tokens.get(i, t) for i, t in enumerate(value)]
        elif kind == gguf.GGUFValueType.ARRAY and isinstance(value, list) and len(value) == total:
            value = value[:layers]  # per-layer lists (a sliding-window pattern)
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    kept = [t for t in reader.tensors if not (m := re.match(r"blk\.(\d+)\.", t.name)) or int(m.group(1)) < layers]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return dst


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
