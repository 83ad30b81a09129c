"""An image decoded beside the engine: a second llama context on the same model, owned by
the encoder thread, so that no step of anyone else's waits for an image's decode.

Encoding an image was already off the engine thread (worker/media/encoder.py); decoding its
embeddings into the request's sequence was not, and for gemma-3's projectors that decode is
one non-causal batch of every image position (256 for a 896-pixel image): on a CPU, half a
second during which every other stream's next token waited. Measured with this llama.cpp,
moving a sequence's cells between two contexts of one model costs far less than that
decode, and is exact (a request's logits after its image were bit-identical to the image
decoded in place), so the image goes this way:

1. the engine thread reads the request's sequence (its text up to the image) out of its
   context (`llama_state_seq_get_data`: a copy of the cells, a few ms for a short prompt);
2. the encoder thread writes it into this context's one sequence, encodes the image if no
   cache holds its embeddings, decodes them here, then the request's text after the image
   up to the next image or the prompt's last token (decoded by the engine, that text made
   the step after the image twice as long as the others: 57 ms against 27, in-process),
   and reads the sequence back out;
3. the engine thread puts those cells in place of the request's sequence
   (worker/media/steps.py) and decodes the prompt's last token itself, for its logits,
   with everyone else's.

Only on a CPU: there the decode is what every stream waits for, and both copies are host
memory. On a GPU the decode takes milliseconds and the copies would cross the bus twice, so
the engine decodes in place. The context is made as the model loads, on the encoder thread
(made at the first image, it cost every running stream a 100 ms step): its KV cache holds
one request's longest prompt, `n_ctx_slot` cells, and with its compute buffers it took
148 MiB for the demo model at 8,192 cells. A longer prompt, or cells the engine's cache has
no room for, is decoded in place as before; so is one of a model loaded with `swa_full`,
whose sliding-window cells for a long prompt outnumber this context's (llama.cpp refuses
the copy, and nothing is lost but the time).
"""

from __future__ import annotations

import logging

import llama_cpp

from worker.batch import BatchBuffer
from worker.kv_positions import position
from worker.load_params import context_options
from worker.media.projector import Projector
from worker.media.spans import ImageSpan
from worker.protocol.load_options import LoadOptions
from worker.seq_state import read_state, write_state

log = logging.getLogger("worker.media")


class Beside:
    """The encoder thread's context; every method but `fits` runs on that thread."""

    def __init__(self, projector: Projector, n_ctx: int, n_threads: int, options: LoadOptions) -> None:
        self.projector = projector
        self.options = options  # the engine context's: its KV types and RoPE, or no copy fits
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.ctx: llama_cpp.llama_context_p | None = None
        self.batch: BatchBuffer | None = None  # for the text after an image
        self.broken = False  # the context could not be made: every image is decoded in place
        self.decoded = 0  # images decoded here

    def fits(self, end: int) -> bool:
        """Whether a sequence of `end` tokens fits this context."""
        return not self.broken and end <= self.n_ctx

    def decode(self, span: ImageSpan, prefix: bytes, tail: list[int]) -> bytes | None:
        """The cells of a sequence that held `prefix` (llama_state_seq_get_data's bytes of
        the request's text up to `span`) with `span`'s embeddings decoded after it, and the
        text tokens `tail` after those; None when they could not be made here (the engine
        then decodes in place)."""
        ctx = self.open()
        if ctx is None or self.batch is None:
            return None
        memory = llama_cpp.llama_get_memory(ctx)
        llama_cpp.llama_memory_seq_rm(memory, 0, -1, -1)
        try:
            if prefix and not write_state(ctx, 0, prefix):
                log.warning("an image's prompt could not be copied beside the engine: decoding it in place")
                return None
            if llama_cpp.llama_memory_seq_pos_max(memory, 0) != span.pos - 1:
                log.error("an image's prompt copied beside the engine ends at %d, not %d: decoding it in place",
                          llama_cpp.llama_memory_seq_pos_max(memory, 0), span.pos - 1)
                return None
            rc = self.projector.decode(ctx, span, 0)
            if rc != 0:
                log.warning("decoding an image beside the engine returned %d: decoding it in place", rc)
                return None
            after = span.pos + position(span.tokens, span.n, self.projector.mrope)
            for i in range(0, len(tail), self.batch.capacity):
                self.batch.clear()
                self.batch.add(tail[i : i + self.batch.capacity], after + i, 0, "none")
                if (rc := llama_cpp.llama_decode(ctx, self.batch.struct())) != 0:
                    log.warning("decoding the text after an image beside the engine returned %d: decoding it in place", rc)
                    return None
            self.decoded += 1
            return read_state(ctx, 0) or None
        finally:
            llama_cpp.llama_memory_seq_rm(memory, 0, -1, -1)

    def open(self) -> llama_cpp.llama_context_p | None:
        """The context, made at the first call (None when it cannot be)."""
        if self.ctx is None and not self.broken:
            params = llama_cpp.llama_context_default_params()
            params.n_ctx = self.n_ctx
            params.n_seq_max = 1
            params.n_threads = params.n_threads_batch = self.n_threads
            context_options(params, self.options)
            # An image is decoded in batches of the projector's n_ubatch (one, when it attends
            # both ways): the same sizes as the engine's context, so the same kernels.
            params.n_batch = params.n_ubatch = self.projector.n_ubatch
            self.batch = BatchBuffer(self.projector.n_ubatch)
            ctx = llama_cpp.llama_init_from_model(self.projector.model, params)
            if not ctx:
                log.warning("no context beside the engine could be made for images (%d cells): decoding them in place",
                            self.n_ctx)
                self.broken = True
                return None
            self.ctx = ctx
        return self.ctx

    def close(self) -> None:
        if self.ctx is not None:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None

