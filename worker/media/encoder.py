"""The encoder thread: images encoded beside the engine loop, never inside a step.

Encoding is the slow part of an image (the vision tower: seconds on a CPU for SigLIP-400M),
and llama-server runs it in its main loop, so every other slot waits. Here the engine asks
for an image's embeddings only when a request's decoding reaches it and no cache holds it
already (a second turn with the same image encodes nothing); the request then waits, the
others go on stepping, and the engine is woken when the embeddings are ready.

Encoded images are kept in an LRU of `keep_bytes`, keyed by the request's cache scope and the
image's digest (pixels and projector): a preempted request, an n > 1 sibling or a later
request of the same key sending the same image reuses them. Another key's request encodes
it again, as it decodes its own prompt: an image reused across keys would tell, by its
speed, that someone else sent it (router/server/cache_scope.py).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections import OrderedDict
from typing import Any, Callable

from worker.media.beside import Beside
from worker.media.projector import Projector
from worker.media.spans import ImageSpan
from worker.preparer import NICE
from worker.protocol.load_options import LoadOptions

log = logging.getLogger("worker.media")

KEEP_BYTES = 64 * 1024 * 1024


class Encoder:
    def __init__(
        self, projector: Projector, wake: Callable[[], None], keep_bytes: int = KEEP_BYTES, n_ctx_slot: int = 0,
        options: LoadOptions | None = None,
    ) -> None:
        self.projector = projector
        # Where images are decoded off the engine thread: beside it, in a context for one
        # request's longest prompt, on a CPU; nowhere (in place) on a GPU, where the decode
        # takes milliseconds and the copies would cross the bus (worker/media/beside.py).
        self.beside = (
            Beside(projector, n_ctx_slot, projector.n_threads, options or LoadOptions())
            if n_ctx_slot > 0 and not projector.use_gpu else None
        )
        self._wake = wake  # puts a no-op into the engine's inbox: the engine looks again
        # An image to encode, with the cells to decode it after beside the engine and the
        # text to decode after it (or None: encode only).
        self._todo: queue.SimpleQueue[tuple[ImageSpan, tuple[bytes, list[int]] | None] | None] = queue.SimpleQueue()
        self._kept: OrderedDict[tuple[str, bytes], Any] = OrderedDict()
        self._kept_bytes = 0
        self._keep_bytes = keep_bytes
        self._lock = threading.Lock()
        self.reused = 0  # images whose embeddings came from the LRU
        self._thread = threading.Thread(target=self._loop, name="encode", daemon=True)
        self._thread.start()

    @property
    def encodes(self) -> int:
        return self.projector.encodes

    def want(self, span: ImageSpan, scope: str) -> None:
        """Have `span`'s embeddings made for a request of cache scope `scope` (engine
        thread); never blocks."""
        if span.embd is not None or span.busy or span.failed or self._reuse(span, scope):
            return
        self._put(span, scope, None)

    def want_decoded(self, span: ImageSpan, scope: str, prefix: bytes, tail: list[int]) -> None:
        """Have `span` decoded beside the engine after `prefix`, the cells of its request's
        sequence up to it, and the text `tail` after it (engine thread; `beside` is set);
        never blocks. Its embeddings are made first if no cache holds them."""
        if span.busy or span.failed:
            return
        if span.embd is None:
            self._reuse(span, scope)
        self._put(span, scope, (prefix, tail))

    def _reuse(self, span: ImageSpan, scope: str) -> bool:
        key = (scope, span.digest)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
        if kept is None:
            return False
        span.embd = kept
        self.reused += 1
        return True

    def _put(self, span: ImageSpan, scope: str, beside: tuple[bytes, list[int]] | None) -> None:
        span.busy = True
        span.scope = scope
        self._todo.put((span, beside))

    def stop(self) -> None:
        self._todo.put(None)

    def _loop(self) -> None:
        # Below the decode threads, as the tokenizing thread runs (worker/preparer.py): the
        # encode takes the CPU the streams' steps leave over, and its compute threads,
        # started from this one, inherit its priority.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except OSError as exc:
            log.warning("could not lower the encoding thread's priority: %s", exc)
        if self.beside is not None:
            # Made now, as the model loads, not at the first image: making it took 100 ms
            # of CPU and memory that every running stream's step felt (worker/media/beside.py).
            self.beside.open()
        while (job := self._todo.get()) is not None:
            span, beside = job
            try:
                if span.embd is None:
                    embd = self.projector.encode(span)
                    self._keep((span.scope, span.digest), embd)
                    span.embd = embd
            except Exception as exc:  # costs this request, never the worker
                log.exception("encoding an image or a sound failed")
                span.failed = f"the image or sound could not be encoded: {exc}"
            if beside is not None and self.beside is not None and span.embd is not None:
                prefix, tail = beside
                try:
                    span.cells = self.beside.decode(span, prefix, tail)
                    span.tail = tail
                except Exception:  # the engine's context still can
                    log.exception("decoding an image beside the engine failed: decoding it in place")
                span.in_place = span.cells is None
            span.busy = False  # after the results: the engine reads them once it sees this
            self._wake()
        if self.beside is not None:
            self.beside.close()

    def _keep(self, key: tuple[str, bytes], embd: Any) -> None:
        with self._lock:
            if key in self._kept:
                return
            self._kept[key] = embd
            self._kept_bytes += embd.nbytes
            while self._kept_bytes > self._keep_bytes and self._kept:
                _, old = self._kept.popitem(last=False)
                self._kept_bytes -= old.nbytes
