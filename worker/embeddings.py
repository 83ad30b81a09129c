"""One embedding request, decoded whole: the engine calls `embed` between steps and emits
what it returns.

An embedding model has no generation to interleave with, so a job does not take part in the
step loop: its inputs are packed into as few decodes as the batch allows, each input in a
sequence of its own so that pooling gives one vector per input. The preparing threads have
tokenized the inputs and checked that each fits a batch (worker/preparer.py).
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from worker.batch import BatchBuffer
from worker.model import LoadedModel
from worker.protocol import EmbedResult, Error
from worker.request import EmbedJob


def embed(m: LoadedModel, batch: BatchBuffer, n_seq: int, job: EmbedJob) -> EmbedResult | Error:
    """The job's vectors, each scaled to unit length (L2), or the Error to answer with.

    Runs on the engine thread and uses the whole KV cache: every sequence is cleared before
    each decode (and after the last), so whatever the caller's slots had cached is gone
    either way. `n_seq` is the context's sequence count, which bounds the inputs per decode
    as `batch`'s capacity (n_batch) bounds their tokens.
    """
    tokenized = job.inputs
    out: list[list[float]] = [[] for _ in tokenized]
    i = 0
    while i < len(tokenized):
        batch.clear()
        group: list[int] = []
        while i < len(tokenized) and len(group) < n_seq and len(tokenized[i]) <= batch.free:
            batch.add(tokenized[i], 0, len(group), "all")
            group.append(i)
            i += 1
        # Sequence ids restart at 0 in every group: the last group's pooled state must go.
        llama_cpp.llama_memory_clear(m.memory, True)
        rc = llama_cpp.llama_decode(m.ctx, batch.struct())
        if rc != 0:
            return Error(id=job.id, code="internal", message=f"llama_decode failed with {rc}")
        for seq, idx in enumerate(group):
            ptr = llama_cpp.llama_get_embeddings_seq(m.ctx, seq)
            if not ptr:
                return Error(id=job.id, code="internal", message="no pooled embedding")
            vec = np.ctypeslib.as_array(ptr, shape=(m.n_embd,)).astype(np.float64)
            norm = float(np.linalg.norm(vec))
            # A zero vector has no direction to keep; it goes out as it came.
            out[idx] = (vec / norm if norm > 0 else vec).tolist()
    llama_cpp.llama_memory_clear(m.memory, True)
    return EmbedResult(id=job.id, data=out, prompt_tokens=sum(map(len, tokenized)))
