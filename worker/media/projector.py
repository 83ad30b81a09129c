"""A model's projector (its mmproj GGUF) through libmtmd's low-level calls.

llama-cpp-python's chat handlers evaluate images into sequence 0 of a context of their own;
a batching worker needs each image in its own request's sequence, encoded beside the step
loop. So the worker uses libmtmd directly (llama_cpp/mtmd_cpp.py):

- `tokenize` (preparing thread): the rendered prompt, with a media marker where each image
  or sound goes, and the images' pixels (worker/media/pictures.py) and the sounds' samples
  (worker/media/sounds.py) into text tokens and media chunks (`mtmd_tokenize`, which also
  adds the model's own delimiters, such as gemma-3's <start_of_image>, and cuts a sound into
  30 s windows, a chunk each). Each media chunk is copied out as an `ImageSpan` of
  placeholder ids (worker/media/spans.py).
- `encode` (the encoder thread, worker/media/encoder.py): the vision tower, or the audio
  encoder, on one chunk (`mtmd_encode_chunk`), its output copied out; the projector is its
  own ggml context, so this runs while the engine thread decodes.
- `decode` (the engine thread): the embeddings into the request's sequence at its position
  (`mtmd_helper_decode_image_chunk`, images and audio alike, which decodes them in batches
  of their own and, for a projector that asks for it such as gemma-3's, with non-causal
  attention; audio chunks are causal).

M-RoPE models (the Qwen2-VL family) place an image's tokens on a 2-D grid: its n tokens take
`n_pos` positions (`mtmd_input_chunk_get_n_pos`), which its placeholders carry
(worker/media/spans.py) and worker/kv_positions.py turns into each token's position.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from typing import Sequence, Union

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mt

from worker.kv_positions import position
from worker.llama_log import on_llama_log
from worker.media.pictures import Pixels
from worker.media.sounds import Sound
from worker.media.spans import ImageSpan, placeholders
from worker.model import LoadError
from worker.protocol import MEDIA_MARKER
from worker.rejected import RequestRejected

log = logging.getLogger("worker.media")

# Module-level, like worker/model.py's: the thunk must outlive every call into libmtmd.
_LOG_CALLBACK = llama_cpp.llama_log_callback(on_llama_log)
_NO_CALLBACK = mt.mtmd_helper_post_decode_callback()
_MARKER = MEDIA_MARKER.encode()  # referenced for the process's life: libmtmd reads it at init

Item = Union[Pixels, Sound]  # what a media marker stands for, decoded


class OwnedChunk:
    """A copy of one libmtmd image chunk, freed with its last reference."""

    def __init__(self, ptr: mt.mtmd_input_chunk_p | None) -> None:
        self.ptr: mt.mtmd_input_chunk_p | None = ptr

    def __del__(self) -> None:
        if self.ptr:
            mt.mtmd_input_chunk_free(self.ptr)
            self.ptr = None


def identity(path: str) -> bytes:
    """What distinguishes this projector's embeddings from another's: its size and its first
    MiB (the header, and the first tensors), hashed. Enough to tell two projector files
    apart, without reading gigabytes at every load."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(os.fstat(f.fileno()).st_size.to_bytes(8, "little"))
        h.update(f.read(1 << 20))
    return h.digest()


class Projector:
    def __init__(
        self, path: str, model: llama_cpp.llama_model_p, n_threads: int, n_ubatch: int, use_gpu: bool = False
    ) -> None:
        mt.mtmd_log_set(_LOG_CALLBACK, None)
        mt.mtmd_helper_log_set(_LOG_CALLBACK, None)
        if not os.path.isfile(path):
            raise LoadError("the projector (mmproj) file does not exist", f"mmproj not found: {path}")
        params = mt.mtmd_context_params_default()
        params.use_gpu = use_gpu  # with the model's layers: a GPU encodes far faster
        params.n_threads = n_threads
        params.print_timings = False
        params.media_marker = _MARKER  # the router's, never a client's
        # As llama-server does: the encoders' compute graphs are built and their buffers
        # reserved at load, so a projector whose graph cannot be built here fails the load.
        # It computes nothing (no encode runs until a request's does): a graph that builds
        # and then fails to encode fails that request's image, or, where libmtmd asserts,
        # the process, which is why the config check refuses what it can tell from the header
        # (supervisor/config/projector.py).
        params.warmup = True
        ctx = mt.mtmd_init_from_file(path.encode(), model, params)
        if not ctx:
            raise LoadError(
                "llama.cpp could not load the projector (mmproj): not a projector GGUF, or not one for this model",
                f"mtmd_init_from_file refused {path}",
            )
        self.ctx = ctx
        self.model = model
        self.vision = bool(mt.mtmd_support_vision(ctx))
        self.audio = bool(mt.mtmd_support_audio(ctx))
        # The Qwen2-VL family: an image's tokens take fewer positions than they are
        # (worker/kv_positions.py); the text model's rope type decides it.
        self.mrope = bool(mt.mtmd_decode_use_mrope(ctx))
        self.use_gpu = use_gpu
        self.n_threads = n_threads
        # The rate the audio encoder takes (16 kHz for Whisper's); sounds are resampled to it.
        self.sample_rate = int(mt.mtmd_get_audio_sample_rate(ctx)) if self.audio else 0
        self.n_embd = int(llama_cpp.llama_model_n_embd_inp(model))
        self.n_ubatch = n_ubatch
        self.identity = identity(path)
        self.encodes = 0  # images encoded (Pong's prompt_cache counters: images_encoded)

    def close(self) -> None:
        if self.ctx:
            mt.mtmd_free(self.ctx)
            self.ctx = None

    # ---- preparing thread -----------------------------------------------------------------------

    def digest(self, item: Item) -> bytes:
        h = hashlib.sha256(self.identity)
        if isinstance(item, Pixels):
            h.update(item.width.to_bytes(4, "little") + item.height.to_bytes(4, "little"))
            h.update(item.rgb)
        else:
            h.update(b"audio" + item.rate.to_bytes(4, "little"))
            h.update(item.samples.tobytes())
        return h.digest()

    def tokenize(
        self, text: str, items: Sequence[Item], params: Sequence[str], add_special: bool = True
    ) -> tuple[list[int], list[ImageSpan]]:
        """`text`'s tokens with a span of placeholders for each image, and for each 30 s
        window of each sound, in marker order."""
        bitmaps = []
        try:
            for i, item in enumerate(items):
                if isinstance(item, Pixels):
                    buf = (ctypes.c_uint8 * len(item.rgb)).from_buffer_copy(item.rgb)
                    bm = mt.mtmd_bitmap_init(item.width, item.height, buf)
                else:  # libmtmd copies the samples
                    pcm = np.ascontiguousarray(item.samples, dtype=np.float32)
                    bm = mt.mtmd_bitmap_init_from_audio(len(pcm), pcm.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
                if not bm:
                    raise RequestRejected("invalid_request", "the projector could not take it", params[i])
                bitmaps.append(bm)
                # The item's place, so that each chunk is known to be its (a sound makes one
                # a window, all with the bitmap's id), and its digest.
                mt.mtmd_bitmap_set_id(bm, f"{i}:{self.digest(item).hex()}".encode())
            return self._tokenize(text, bitmaps, [isinstance(it, Sound) for it in items], params, add_special)
        finally:
            for bm in bitmaps:
                mt.mtmd_bitmap_free(bm)

    def _tokenize(
        self, text: str, bitmaps: list[mt.mtmd_bitmap_p], audio: list[bool], params: Sequence[str], add_special: bool
    ) -> tuple[list[int], list[ImageSpan]]:
        data = text.encode("utf-8", errors="replace")
        inp = mt.mtmd_input_text(data, len(data), add_special, True)
        arr = (mt.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        chunks = mt.mtmd_input_chunks_init()
        try:
            rc = mt.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc == 1:
                raise RequestRejected(
                    "invalid_request",
                    f"the prompt has {text.count(MEDIA_MARKER)} places for images or audio and {len(bitmaps)} of them",
                    params[0] if params else "prompt",
                )
            if rc != 0:
                raise RequestRejected("invalid_request", f"the projector could not read an image or a sound (error {rc})",
                                      params[0] if params else None)
            tokens: list[int] = []
            spans: list[ImageSpan] = []
            windows: dict[int, int] = {}  # an item's chunks so far
            for i in range(mt.mtmd_input_chunks_size(chunks)):
                c = mt.mtmd_input_chunks_get(chunks, i)
                kind = mt.mtmd_input_chunk_get_type(c)
                if kind == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    ids = mt.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
                    tokens.extend(ids[j] for j in range(n.value))
                    continue
                index, _, hex_digest = (mt.mtmd_input_chunk_get_id(c) or b"").decode().partition(":")
                item = int(index)
                param = params[item]
                want = mt.MTMD_INPUT_CHUNK_TYPE_AUDIO if audio[item] else mt.MTMD_INPUT_CHUNK_TYPE_IMAGE
                if kind != want:  # the worker's own check said it takes this kind: never a client's doing
                    raise RequestRejected("unsupported", "the projector made a chunk of another kind than it was sent", param)
                n_tok = int(mt.mtmd_input_chunk_get_n_tokens(c))
                if mt.mtmd_decode_use_non_causal(self.ctx, c) and n_tok > self.n_ubatch:
                    raise RequestRejected(
                        "invalid_request",
                        f"the image makes {n_tok} tokens, which must be decoded in one batch; this model's "
                        f"n_batch allows {self.n_ubatch}",
                        param,
                    )
                digest = chunk_digest(bytes.fromhex(hex_digest), windows.get(item, 0))
                windows[item] = windows.get(item, 0) + 1
                owned = OwnedChunk(mt.mtmd_input_chunk_copy(c))
                n_pos = int(mt.mtmd_input_chunk_get_n_pos(c)) if self.mrope else None
                span = ImageSpan(
                    start=len(tokens), tokens=placeholders(digest, n_tok, n_pos), digest=digest, chunk=owned, param=param,
                    pos=position(tokens, len(tokens), self.mrope),
                )
                spans.append(span)
                tokens.extend(span.tokens)
            return tokens, spans
        finally:
            mt.mtmd_input_chunks_free(chunks)

    # ---- encoder thread -------------------------------------------------------------------------

    def encode(self, span: ImageSpan) -> np.ndarray:
        """The embeddings of `span`'s image: n x n_embd float32, a copy of libmtmd's buffer."""
        rc = mt.mtmd_encode_chunk(self.ctx, span.chunk.ptr)
        if rc != 0:
            raise RuntimeError(f"mtmd_encode_chunk returned {rc}")
        out = mt.mtmd_get_output_embd(self.ctx)
        self.encodes += 1
        return np.ctypeslib.as_array(out, shape=(span.n * self.n_embd,)).copy()

    # ---- engine thread --------------------------------------------------------------------------

    def decode(self, lctx: llama_cpp.llama_context_p, span: ImageSpan, seq_id: int) -> int:
        """Decode `span`'s embeddings at its positions in sequence `seq_id`: llama_decode's
        return code (0 done, 1 no KV room)."""
        assert span.embd is not None
        new_past = llama_cpp.llama_pos(0)
        embd = span.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        rc = int(mt.mtmd_helper_decode_image_chunk(
            self.ctx, lctx, span.chunk.ptr, embd, span.pos, seq_id, self.n_ubatch, ctypes.byref(new_past),
            _NO_CALLBACK, None,
        ))
        if rc != 0:
            # A chunk of more than n_ubatch tokens (a causal one: audio) is decoded in several
            # batches, and the helper returns at the first that fails with the others' cells
            # kept; the books end at span.start (position span.pos), so nothing past it may stay.
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(lctx), seq_id, span.pos, -1)
        return rc


def chunk_digest(digest: bytes, k: int) -> bytes:
    """The digest of an item's `k`th chunk: the item's own for its first (an image's only
    chunk), one drawn from it for each later one (a sound's later windows, an image a
    projector slices into tiles). Chunks of one item share libmtmd's id; without this they
    would share placeholders, and the encoder's kept embeddings."""
    return digest if k == 0 else hashlib.sha256(digest + k.to_bytes(4, "little")).digest()
