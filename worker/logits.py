"""Edits to a request's logits before its sampler chain samples them.

llama.cpp hands out the logits of each batch entry as a writable float array
(`llama_get_logits_ith`), valid until the next decode. Whatever has to steer sampling
(a grammar's token mask, a logit bias) edits that array in place, at the request's batch
index, before `SamplerChain.sample` reads it. Both of the chain's paths see the edit: the
greedy argmax reads the same buffer, and llama.cpp's samplers build their candidates from it.

An adjustment is anything with `apply(logits)`. Order matters where adjustments combine: a
constraint's mask goes last, so that nothing added after it can lift a forbidden token.
"""

from __future__ import annotations

from typing import Protocol

import llama_cpp
import numpy as np
import numpy.typing as npt

Logits = npt.NDArray[np.float32]


class LogitsAdjustment(Protocol):
    def apply(self, logits: Logits) -> None:
        """Edit `logits` (one float per vocabulary entry) in place."""
        ...


def logits_at(ctx: llama_cpp.llama_context_p, batch_index: int, n_vocab: int) -> Logits:
    """A writable view of the logits at `batch_index`; valid only until the next decode.

    The caller guarantees that the batch entry had its logits flag set (llama.cpp returns
    NULL otherwise, which numpy cannot view)."""
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, batch_index), shape=(n_vocab,))


class LogitBias:
    """OpenAI's logit_bias as an adjustment: added in place. The preparing thread has
    checked every id against the vocabulary; -100 all but bans a token, as OpenAI
    documents. The ids and values are arrays once, not per token."""

    def __init__(self, bias: dict[int, float]) -> None:
        self._ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self._values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))

    def apply(self, logits: Logits) -> None:
        logits[self._ids] += self._values
