"""Embedding jobs, one decode at a time: the engine runs a job batch by batch between its
other work, so that a Cancel (the client left) stops it within one batch.

An embedding model has no generation to interleave with, so a job does not take part in the
step loop: its inputs are packed into as few decodes as the batch allows, each input in a
sequence of its own so that pooling gives one vector per input. The preparing threads have
tokenized the inputs and checked that each fits a batch (worker/preparer.py). Jobs run one
after another in arrival order; the router's slot line (supervisor/slot_queue.py) bounds how
many wait.

Before this, a job was decoded whole as soon as it reached the engine, and a Cancel queued
behind it could do nothing: 40 abandoned requests of 4 inputs kept a worker at 100% CPU for
25 s after their clients had gone (issue 20).

One batch can itself take over a second: llama.cpp outputs every token of an embedding
batch, so a causal model computes its vocabulary projection for each (1.15 s for one
352-token input of the demo model on 2 cores). So a Cancel also stops the batch under way:
the engine of an embedding model installs llama.cpp's abort callback, which ggml's CPU
backend calls after each graph node (about 400 per decode, no measurable cost against a
decode of this size; a generation engine never installs it, as there the calls would
count), and which answers True once the job is `cancelled`. llama_decode then returns 2
within a node.
"""

from __future__ import annotations

import collections
import logging
from typing import Callable

import llama_cpp
import numpy as np

from worker.batch import BatchBuffer
from worker.model import LoadedModel
from worker.protocol import EmbedResult, Error
from worker.request import EmbedJob

log = logging.getLogger("worker")


class EmbedRun:
    """One job under way: `step()` decodes its next batch of inputs."""

    def __init__(self, m: LoadedModel, batch: BatchBuffer, n_seq: int, job: EmbedJob) -> None:
        self.m, self.batch, self.n_seq, self.job = m, batch, n_seq, job
        self.out: list[list[float]] = [[] for _ in job.inputs]
        # pooling = "none": llama.cpp pools nothing, and each input's vectors are its
        # tokens' (llama-server's native /embedding answers them so).
        self.per_token: list[list[list[float]]] | None = [[] for _ in job.inputs] if m.pooling == "none" else None
        self.done = 0  # inputs embedded so far
        self.busy = 0  # sequences in the last decode (for occupancy)
        # Set by the link's thread when the client has gone; read by the abort callback on
        # the engine thread, in the middle of a decode (a bool: one atomic store).
        self.cancelled = False

    @property
    def id(self) -> int:
        return self.job.id

    def step(self) -> EmbedResult | Error | None:
        """Decode the next group of inputs (as many as fit `batch` and the context's
        sequences). The answer once the last group is done, else None. Uses the whole KV
        cache: every sequence is cleared before each decode and after the last."""
        m, batch, tokenized = self.m, self.batch, self.job.inputs
        if self.cancelled:  # the engine reads the Cancel next, and drops the job
            return None
        batch.clear()
        group: list[int] = []
        starts: list[int] = []  # where each input's tokens begin in the batch
        i = self.done
        while i < len(tokenized) and len(group) < self.n_seq and len(tokenized[i]) <= batch.free:
            starts.append(batch.n)
            batch.add(tokenized[i], 0, len(group), "all")
            group.append(i)
            i += 1
        if not group:  # the preparer refuses an input longer than a batch: never here
            return Error(id=self.job.id, code="internal", message="an input does not fit a batch")
        self.busy = len(group)
        # Sequence ids restart at 0 in every group: the last group's pooled state must go.
        llama_cpp.llama_memory_clear(m.memory, True)
        rc = llama_cpp.llama_decode(m.ctx, batch.struct())
        if rc == 2 and self.cancelled:  # aborted halfway: see the module's docstring
            return None
        if rc != 0:
            return Error(id=self.job.id, code="internal", message=f"llama_decode failed with {rc}")
        for seq, idx in enumerate(group):
            if self.per_token is not None:
                error = self._read_tokens(idx, starts[seq])
                if error is not None:
                    return error
                continue
            ptr = llama_cpp.llama_get_embeddings_seq(m.ctx, seq)
            if not ptr:
                return Error(id=self.job.id, code="internal", message="no pooled embedding")
            if self.job.scores:  # a reranker's: n_cls_out scores a sequence, as they are
                self.out[idx] = np.ctypeslib.as_array(ptr, shape=(m.n_cls_out,)).astype(np.float64).tolist()
                continue
            vec = np.ctypeslib.as_array(ptr, shape=(m.n_embd,)).astype(np.float64)
            self.out[idx] = normalized(vec, self.job.normalize).tolist()
        self.done = i
        if self.done < len(tokenized):
            return None
        llama_cpp.llama_memory_clear(m.memory, True)
        n = sum(map(len, tokenized))
        if self.per_token is not None:
            return EmbedResult(id=self.job.id, data=[], prompt_tokens=n, per_token=self.per_token)
        return EmbedResult(id=self.job.id, data=self.out, prompt_tokens=n)

    def _read_tokens(self, idx: int, start: int) -> Error | None:
        """Input `idx`'s per-token vectors, from batch positions `start` on."""
        assert self.per_token is not None
        vectors = self.per_token[idx]
        for pos in range(start, start + len(self.job.inputs[idx])):
            ptr = llama_cpp.llama_get_embeddings_ith(self.m.ctx, pos)
            if not ptr:
                return Error(id=self.job.id, code="internal", message="no token embedding")
            vectors.append(np.ctypeslib.as_array(ptr, shape=(self.m.n_embd,)).astype(np.float64).tolist())
        return None

    def abandon(self) -> None:
        """Cancelled: what it decoded is of no use to anyone."""
        llama_cpp.llama_memory_clear(self.m.memory, True)


def normalized(vec: np.ndarray, p: int) -> np.ndarray:
    """`vec` scaled as llama.cpp's common_embd_normalize does (llama-server's
    embd_normalize): -1 as it is, 0 its largest magnitude to 32760 (int16's range), 2 to
    Euclidean length 1, another p to p-norm 1. A zero vector has no direction to keep, and
    goes out as it came (llama.cpp's too)."""
    if p < 0:
        return vec
    if p == 0:
        norm = float(np.max(np.abs(vec))) / 32760.0 if vec.size else 0.0
    elif p == 2:
        norm = float(np.linalg.norm(vec))
    else:
        norm = float(np.sum(np.abs(vec) ** p) ** (1.0 / p))
    return vec / norm if norm > 0 else vec


class EmbedLine:
    """An embedding engine's jobs: waiting in arrival order, and the one under way. The
    engine thread calls everything but `cancel_soon`, which the link's thread calls."""

    def __init__(
        self, m: LoadedModel, batch: BatchBuffer, n_seq: int, emit: Callable[[EmbedResult | Error], None]
    ) -> None:
        self.m, self.batch, self.n_seq, self.emit = m, batch, n_seq, emit
        self.jobs: collections.deque[EmbedJob] = collections.deque()
        self.running: EmbedRun | None = None
        self._abort = llama_cpp.ggml_abort_callback(self._should_abort)  # kept: C holds it
        llama_cpp.llama_set_abort_callback(m.ctx, self._abort, None)

    @property
    def idle(self) -> bool:
        return self.running is None and not self.jobs

    @property
    def busy(self) -> int:
        """Sequences of the batch under way (counted as busy slots)."""
        run = self.running
        return run.busy if run is not None else 0

    def add(self, job: EmbedJob) -> None:
        self.jobs.append(job)

    def step(self) -> bool:
        """Decode one batch of the job under way, starting the next job if none is; emit
        its answer once it is done. False if there was nothing to do. Every batch clears
        the whole KV cache."""
        if self.running is None:
            if not self.jobs:
                return False
            self.running = EmbedRun(self.m, self.batch, self.n_seq, self.jobs.popleft())
        run = self.running
        try:
            answer = run.step()
        except Exception as exc:  # costs this job only
            log.exception("embedding job %s", run.id)
            answer = Error(id=run.id, code="internal", message=f"engine error: {exc}")
        if answer is not None:
            self.running = None
            self.emit(answer)
        return True

    def cancel_soon(self, rid: int) -> None:
        """From the link's thread: stop job `rid`'s decode under way, if it is running.
        `drop` then removes it, once the engine reads the Cancel."""
        run = self.running
        if run is not None and run.id == rid:
            run.cancelled = True

    def drop(self, rid: int) -> None:
        """Job `rid`'s client is gone: drop it, waiting or under way; nothing is sent."""
        self.jobs = collections.deque(j for j in self.jobs if j.id != rid)
        if self.running is not None and self.running.id == rid:
            self.running.abandon()
            self.running = None
            log.info("embedding job %s cancelled", rid)

    def _should_abort(self, _data: object) -> bool:
        """llama.cpp's abort callback, called on the engine thread after every graph node
        of a decode: stop once the job under way is cancelled."""
        run = self.running
        return run is not None and run.cancelled
