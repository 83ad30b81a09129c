"""A random-weight audio projector (mmproj GGUF) for the demo model, written with gguf-py.

The audio sibling of bench/projector.py: no audio projector for a small model is on the
package registry, so the tests and `make serve CONFIG=examples/audio.toml` make their own.
An `ultravox` projector, the kind fixie-ai's Ultravox ships (a Whisper encoder, its frames
stacked `stack` at a time, an RMSNorm/SwiGLU/RMSNorm MLP into the text model's embeddings),
the one audio projector in llama.cpp whose real pairing is a llama or gemma-3 text model.
Keys and tensor names are the ones llama.cpp's tools/mtmd/clip.cpp reads (load_hparams: the
ULTRAVOX case, which fixes 16 kHz, n_fft 400, hop 160 and 30 s windows; load_tensors: the
ULTRAVOX case and the per-layer tensors); the graph is tools/mtmd/models/whisper-enc.cpp.
libmtmd computes the mel filterbank itself (mtmd-audio.cpp); the GGUF holds none.

Tiny: 80 mel bins, a 64-wide 2-block encoder (4 heads, ffn 96), a 64-wide MLP (32 after
SwiGLU) into `width` (640: gemma-3-270m). F32, about 1 MB, most of it the 1500 x 64
position table whisper-enc.cpp requires (3000 mel frames after its stride-2 convolution).

libmtmd pads every input with 30 s of silence and cuts the log-mel into 30 s windows,
dropping the incomplete last one: T seconds make floor((100 T + 3001) / 3000) windows (one
up to 29.98 s). Each window is one audio chunk of 1500 / `stack` tokens (150 here, five a
second), however little of it the audio fills.

A `stack` that divides 1500 makes a projector that works. Another may not: libmtmd counts a
window's tokens as ceil(3000 / stack) // 2, its graph pads with ggml's GGML_PAD (a bit mask,
a true round-up only for powers of two), and at the first encode where the two differ it
aborts the process ("Invalid number of output tokens"). Stacking this 64-wide encoder by 8 is
such a case (187 against 188; Ultravox's own 8, on a 1280-wide encoder, agrees), which
Corral's config check refuses (supervisor/config/projector.py); this writer makes one on
request, for that check's test.

Deterministic: the same arguments give the same bytes. `scale` multiplies the last matrix,
so that different audio changes the greedy text and not only the logits (random weights at
the usual scale give embeddings too small to move a 270M model's choice).

    python -m bench.audio_projector models/mmproj-audio-test.gguf [--width 640] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from bench import gguf_out

N_MEL = 80  # whisper's (128 for large-v3)
HIDDEN = 64  # the encoder's width
FFN = 96  # must differ from HIDDEN: clip.cpp swaps ffn_up/ffn_down when they are equal
BLOCKS = 2
HEADS = 4
STACK = 10
MLP = 64  # mm.a.mlp.1's output, halved by SwiGLU: must be even
N_POS = 1500  # 3000 mel frames after the stride-2 convolution
SAMPLE_RATE = 16_000  # what libmtmd takes for an ultravox projector (clip.cpp)


def tokens_per_window(stack: int = STACK) -> int:
    """The tokens one 30 s window makes (the graph's rows: what the test projector gives)."""
    return -(-N_POS // stack)


def write(path: str | os.PathLike[str], width: int = 640, seed: int = 0, scale: float = 30.0, stack: int = STACK) -> int:
    """Write an `ultravox` projector for a text model `width` wide to `path` (atomically);
    returns the tokens one 30 s window makes."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    def ones(*shape: int) -> np.ndarray:
        return np.ones(shape, dtype=np.float32)

    def zeros(*shape: int) -> np.ndarray:
        return np.zeros(shape, dtype=np.float32)

    writer = gguf_out.start(path, "clip")
    writer.add_string("general.name", "corral-test-audio-projector")
    writer.add_string("clip.projector_type", "ultravox")
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_bool("clip.use_gelu", True)  # ultravox uses gelu_erf whatever this says
    writer.add_uint32("clip.audio.num_mel_bins", N_MEL)
    writer.add_uint32("clip.audio.embedding_length", HIDDEN)
    writer.add_uint32("clip.audio.feed_forward_length", FFN)
    writer.add_uint32("clip.audio.block_count", BLOCKS)
    writer.add_uint32("clip.audio.projection_dim", width)
    writer.add_uint32("clip.audio.attention.head_count", HEADS)
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.audio.projector.stack_factor", stack)
    # ggml's dimensions are numpy's reversed. conv1d kernels are ggml [k, in, out]; their
    # biases [1, out], so that they broadcast over the frames (as the converter writes them).
    writer.add_tensor("a.conv1d.1.weight", w(HIDDEN, N_MEL, 3, std=0.1))
    writer.add_tensor("a.conv1d.1.bias", zeros(HIDDEN, 1))
    writer.add_tensor("a.conv1d.2.weight", w(HIDDEN, HIDDEN, 3, std=0.1))
    writer.add_tensor("a.conv1d.2.bias", zeros(HIDDEN, 1))
    writer.add_tensor("a.position_embd.weight", w(N_POS, HIDDEN))
    for i in range(BLOCKS):
        # whisper: q, v and out have biases, k has none (whisper-enc.cpp asserts both)
        for name, bias in (("attn_q", True), ("attn_k", False), ("attn_v", True), ("attn_out", True)):
            writer.add_tensor(f"a.blk.{i}.{name}.weight", w(HIDDEN, HIDDEN))
            if bias:
                writer.add_tensor(f"a.blk.{i}.{name}.bias", zeros(HIDDEN))
        writer.add_tensor(f"a.blk.{i}.ffn_up.weight", w(FFN, HIDDEN))
        writer.add_tensor(f"a.blk.{i}.ffn_up.bias", zeros(FFN))
        writer.add_tensor(f"a.blk.{i}.ffn_down.weight", w(HIDDEN, FFN))
        writer.add_tensor(f"a.blk.{i}.ffn_down.bias", zeros(HIDDEN))
        for ln in ("ln1", "ln2"):
            writer.add_tensor(f"a.blk.{i}.{ln}.weight", ones(HIDDEN))
            writer.add_tensor(f"a.blk.{i}.{ln}.bias", zeros(HIDDEN))
    writer.add_tensor("a.post_ln.weight", ones(HIDDEN))
    writer.add_tensor("a.post_ln.bias", zeros(HIDDEN))
    # UltravoxProjector: rms_norm * norm_pre, mlp.1, SwiGLU (halves), rms_norm * norm_mid, mlp.2
    writer.add_tensor("mm.a.norm_pre.weight", ones(HIDDEN * stack))
    writer.add_tensor("mm.a.mlp.1.weight", w(MLP, HIDDEN * stack))
    writer.add_tensor("mm.a.norm_mid.weight", ones(MLP // 2))
    writer.add_tensor("mm.a.mlp.2.weight", w(width, MLP // 2, std=0.02 * scale))
    gguf_out.finish(writer)
    return tokens_per_window(stack)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--width", type=int, default=640, help="the text model's embedding width")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=30.0)
    ap.add_argument("--stack", type=int, default=STACK, help="a divisor of 1500 always works (8 aborts libmtmd)")
    a = ap.parse_args()
    n = write(a.out, a.width, a.seed, a.scale, a.stack)
    print(f"{a.out}: ultravox projector, {SAMPLE_RATE} Hz audio -> {n} tokens a 30 s window")


if __name__ == "__main__":
    main()
