"""A model's projector (its mmproj GGUF) through libmtmd's low-level calls.

llama-cpp-python's chat handlers evaluate images into sequence 0 of a context of their own;
a batching worker needs each image in its own request's sequence, encoded beside the step
loop. So the worker uses libmtmd directly (llama_cpp/mtmd_cpp.py):

- `tokenize` (preparing thread): the rendered prompt, with a media marker where each image
  goes, and the images' pixels (worker/media/pictures.py) into text tokens and image chunks
  (`mtmd_tokenize`, which also adds the model's own image delimiters, such as gemma-3's
  <start_of_image>). Each image chunk is copied out as an `ImageSpan` of placeholder ids
  (worker/media/spans.py).
- `encode` (the encoder thread, worker/media/encoder.py): the vision tower on one chunk
  (`mtmd_encode_chunk`), its output copied out; the projector is its own ggml context, so
  this runs while the engine thread decodes.
- `decode` (the engine thread): the embeddings into the request's sequence at its position
  (`mtmd_helper_decode_image_chunk`, which decodes them in a batch of their own and, for a
  projector that asks for it such as gemma-3's, with non-causal attention).

M-RoPE models (the Qwen2-VL family) place an image's tokens on a 2-D grid: its n tokens take
`n_pos` positions (`mtmd_input_chunk_get_n_pos`), which its placeholders carry
(worker/media/spans.py) and worker/kv_positions.py turns into each token's position.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from typing import Sequence

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mt

from worker.kv_positions import position
from worker.media.pictures import Pixels
from worker.media.spans import ImageSpan, placeholders
from worker.model import LoadError, _on_llama_log
from worker.protocol import MEDIA_MARKER
from worker.rejected import RequestRejected

log = logging.getLogger("worker.media")

# Module-level, like worker/model.py's: the thunk must outlive every call into libmtmd.
_LOG_CALLBACK = llama_cpp.llama_log_callback(_on_llama_log)
_NO_CALLBACK = mt.mtmd_helper_post_decode_callback()
_MARKER = MEDIA_MARKER.encode()  # referenced for the process's life: libmtmd reads it at init


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
        # A dummy image's graph built and its memory reserved at load, as llama-server does
        # (this libmtmd's warmup runs no encode): a projector whose graph cannot be built
        # here fails the load, not the first request that sends an image.
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
        self.n_embd = int(llama_cpp.llama_model_n_embd_inp(model))
        self.n_ubatch = n_ubatch
        self.identity = identity(path)
        self.encodes = 0  # images encoded (Pong's prompt_cache counters: images_encoded)

    def close(self) -> None:
        if self.ctx:
            mt.mtmd_free(self.ctx)
            self.ctx = None

    # ---- preparing thread -----------------------------------------------------------------------

    def digest(self, p: Pixels) -> bytes:
        h = hashlib.sha256(self.identity)
        h.update(p.width.to_bytes(4, "little") + p.height.to_bytes(4, "little"))
        h.update(p.rgb)
        return h.digest()

    def tokenize(
        self, text: str, pictures: Sequence[Pixels], params: Sequence[str], add_special: bool = True
    ) -> tuple[list[int], list[ImageSpan]]:
        """`text`'s tokens with a span of placeholders for each picture, in marker order."""
        bitmaps = []
        try:
            for p in pictures:
                buf = (ctypes.c_uint8 * len(p.rgb)).from_buffer_copy(p.rgb)
                bm = mt.mtmd_bitmap_init(p.width, p.height, buf)
                if not bm:
                    raise RequestRejected("invalid_request", "the image could not be read", None)
                bitmaps.append(bm)
                mt.mtmd_bitmap_set_id(bm, self.digest(p).hex().encode())
            return self._tokenize(text, bitmaps, params, add_special)
        finally:
            for bm in bitmaps:
                mt.mtmd_bitmap_free(bm)

    def _tokenize(
        self, text: str, bitmaps: list[mt.mtmd_bitmap_p], params: Sequence[str], add_special: bool
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
                    f"the prompt has {text.count(MEDIA_MARKER)} places for images and {len(bitmaps)} images",
                    params[0] if params else "prompt",
                )
            if rc != 0:
                raise RequestRejected("invalid_request", f"the projector could not read an image (error {rc})",
                                      params[0] if params else None)
            tokens: list[int] = []
            spans: list[ImageSpan] = []
            for i in range(mt.mtmd_input_chunks_size(chunks)):
                c = mt.mtmd_input_chunks_get(chunks, i)
                kind = mt.mtmd_input_chunk_get_type(c)
                if kind == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    ids = mt.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
                    tokens.extend(ids[j] for j in range(n.value))
                    continue
                param = params[len(spans)] if len(spans) < len(params) else "prompt"
                if kind != mt.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    raise RequestRejected("unsupported", "this model's projector takes images only", param)
                n_tok = int(mt.mtmd_input_chunk_get_n_tokens(c))
                if mt.mtmd_decode_use_non_causal(self.ctx, c) and n_tok > self.n_ubatch:
                    raise RequestRejected(
                        "invalid_request",
                        f"the image makes {n_tok} tokens, which must be decoded in one batch; this model's "
                        f"n_batch allows {self.n_ubatch}",
                        param,
                    )
                ident = mt.mtmd_input_chunk_get_id(c) or b""
                digest = bytes.fromhex(ident.decode())
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
        return int(mt.mtmd_helper_decode_image_chunk(
            self.ctx, lctx, span.chunk.ptr, embd, span.pos, seq_id, self.n_ubatch, ctypes.byref(new_past),
            _NO_CALLBACK, None,
        ))
