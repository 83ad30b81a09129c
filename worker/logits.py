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

import ctypes
from typing import Protocol

import llama_cpp
import numpy as np
import numpy.typing as npt

Logits = npt.NDArray[np.float32]


class LogitsAdjustment(Protocol):
    def apply(self, logits: Logits) -> None:
        """Edit `logits` (one float per vocabulary entry) in place."""
        ...


# llama_get_logits_ith again, returning the row's address as an int: the binding's pointer
# result costs a ctypes object and a cast per step before numpy can view it. Item access
# makes a function object of its own, so the binding's restype is left alone.
_logits_ith = llama_cpp.llama_cpp._lib["llama_get_logits_ith"]
_logits_ith.argtypes = [llama_cpp.llama_context_p_ctypes, ctypes.c_int32]
_logits_ith.restype = ctypes.c_void_p

# Views already made, by (address, length). The same few rows come back every step, and a
# view made once costs nothing to hand out again. A view is only a window: whether its
# memory holds this step's logits is what llama.cpp's answer for this step says, and it
# said this address. Bounded: addresses only change when llama.cpp regrows its buffer.
_views: dict[tuple[int, int], Logits] = {}
_MAX_VIEWS = 4096


def logits_at(ctx: llama_cpp.llama_context_p, batch_index: int, n_vocab: int) -> Logits:
    """A writable view of the logits at `batch_index`; valid only until the next decode.

    The caller guarantees that the batch entry had its logits flag set; llama.cpp returns
    NULL otherwise, which is an error here, never a view."""
    addr = _logits_ith(ctx, batch_index)
    if not addr:
        raise ValueError(f"llama.cpp holds no logits at batch index {batch_index}")
    view = _views.get((addr, n_vocab))
    if view is None:
        if len(_views) >= _MAX_VIEWS:
            _views.clear()
        row = (ctypes.c_float * n_vocab).from_address(addr)
        view = _views[(addr, n_vocab)] = np.frombuffer(memoryview(row), dtype=np.float32)
    return view


class LogitBias:
    """OpenAI's logit_bias as an adjustment: added in place. The preparing thread has
    checked every id against the vocabulary; -100 all but bans a token, as OpenAI
    documents. The ids and values are arrays once, not per token."""

    def __init__(self, bias: dict[int, float]) -> None:
        self._ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self._values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))

    def apply(self, logits: Logits) -> None:
        logits[self._ids] += self._values
