"""The engine's image step: each running request whose decoding has reached an image gets
that image's embeddings decoded into its own sequence, before the step's batch.

- An image whose embeddings are not made yet is asked of the encoder thread
  (worker/media/encoder.py); its request puts nothing into batches until they are, and the
  other requests go on stepping. When every running request waits for an encoder, the
  engine sleeps until one is done (`stalled`).
- On a CPU, an image is decoded beside the engine (worker/media/beside.py): the encoder
  thread gets the request's cells up to the image, returns them with the image's, and
  this step puts them in place of the request's sequence; every other request steps on
  meanwhile. Otherwise (a GPU, a prompt longer than the context beside holds, a copy
  refused) it is decoded here, by a llama_decode of its own: gemma-3's images attend both
  ways (non-causal), which a batch shared with other requests' text cannot do.
- A sequence whose books end inside an image (which no rule should leave, but a cache
  rule that cut a prefix there would) is cut back to the image's start: half an image is
  never kept.
- No KV room for an image: the pool's remedies, asked as for a one-token batch (a smaller
  batch cannot help an image, which is decoded whole): purge, preempt, else the request
  ends with `length`, as a text prompt that fills the pool does.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import llama_cpp

from worker.adapter_turns import AdapterSet
from worker.kv_cache import KvCache
from worker.kv_room import KvRoom
from worker.media.encoder import Encoder
from worker.media.spans import ImageSpan, image_at, text_after
from worker.outcomes import Requests
from worker.request import Request
from worker.seq_state import read_state, write_state
from worker.slots import Slot

log = logging.getLogger("worker.media")


class ImageSteps:
    def __init__(
        self, ctx: llama_cpp.llama_context_p, encoder: Encoder, kv: KvCache, room: KvRoom, requests: Requests,
        apply: Callable[[AdapterSet], None] = lambda _: None,
    ) -> None:
        self.ctx, self.encoder, self.kv, self.room, self.requests = ctx, encoder, kv, room, requests
        # Makes a request's LoRA set the context's before its image is decoded in place
        # (worker/adapters.py); the context beside the engine holds none, so a request
        # with adapters never decodes there.
        self.apply = apply
        self.decoded_tokens = 0  # image positions decoded (they count as prompt tokens decoded)
        self.placed = 0  # images decoded beside the engine whose cells were put in place

    def step(self, slots: Sequence[Slot[Request]]) -> None:
        for slot in slots:
            req = slot.request
            if req is None or not req.images or req.follows is not None or req.awaits is not None:
                continue
            while (span := image_at(req.images, len(slot.cache))) is not None:
                if len(slot.cache) > span.start:
                    self.kv.keep(slot, span.start)
                    if len(slot.cache) != span.start:  # the window rule dropped it all
                        self.kv.drop(slot)
                    continue
                if span.failed:
                    self.requests.error(req, "internal", span.failed)
                    break
                if span.cells is not None:
                    if not self._put_in_place(slot, span):
                        break  # its sequence is empty now: its prompt is decoded again
                    continue
                beside = self.encoder.beside
                end = text_after(req.images, span, len(req.tokens))
                if beside is not None and not span.in_place and not req.adapters and beside.fits(end):
                    if not span.busy:
                        prefix = read_state(self.ctx, slot.seq_id) if span.start else b""
                        self.encoder.want_decoded(span, req.scope, prefix, req.tokens[span.end : end])
                    break
                if span.embd is None:
                    self.encoder.want(span, req.scope)
                    if span.embd is None:
                        break
                self.apply(req.adapters)
                rc = self.encoder.projector.decode(self.ctx, span, slot.seq_id)
                if rc == 0:
                    self.kv.decoded(slot, span.tokens)
                    self.decoded_tokens += span.n
                    continue
                if rc == 1 and self.room.make_room(1) is not None:
                    break  # room was made (or this request preempted): the next step tries again
                self.room.fail_plan([req], rc)
                break

    def _put_in_place(self, slot: Slot[Request], span: ImageSpan) -> bool:
        """Make `slot`'s sequence the cells decoded beside the engine: its text up to
        `span` (which it holds), the image and the text after it. False when the KV cache
        had no room for them (or llama.cpp refused them): the sequence is then empty, and
        the request decodes its prompt again, this image in place."""
        cells, span.cells = span.cells, None
        assert cells is not None and slot.request is not None
        tokens = [*slot.cache, *span.tokens, *span.tail]
        # The text after the image was the request's when it was asked for; it still is
        # (a request waiting at an image adds none), which is checked, not assumed.
        if tokens == slot.request.tokens[: len(tokens)] and self.kv.restore(
            slot, tokens, lambda seq: write_state(self.ctx, seq, cells), slot.scope
        ):
            self.decoded_tokens += span.n + len(span.tail)
            self.placed += 1
            return True
        log.info("slot %d: an image decoded beside the engine found no room in its cache: decoding it in place",
                 slot.seq_id)
        span.in_place = True
        return False

    def stalled(self, slots: Sequence[Slot[Request]]) -> bool:
        """Every running request waits for an image to be encoded: nothing to step."""
        running = [s.request for s in slots if s.request is not None]
        return bool(running) and all(_waits(r, len(r.slot.cache) if r.slot is not None else 0) for r in running)


def _waits(req: Request, n_cached: int) -> bool:
    """`req` is at an image that the encoder thread is working on (its encode, or its decode
    beside the engine). One not asked for yet is not waited on: the next step asks
    (sleeping first cost every image of a request the loop's half-second wait)."""
    if not req.images:
        return False
    span = image_at(req.images, n_cached)
    return span is not None and span.busy
