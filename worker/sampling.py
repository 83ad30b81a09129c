"""One llama.cpp sampler chain per request, built from its SamplingParams.

The order matches llama-server's default (penalties, top_k, top_p, min_p, temperature,
dist). A chain must end in `dist` or `greedy`, or llama.cpp aborts the process, so the
terminal sampler is added here unconditionally and nothing else builds chains.
"""

from __future__ import annotations

import math

import llama_cpp
import msgspec

from worker.logits import logits_at
from worker.protocol import SamplingParams

# llama.cpp's "pick a random seed" value.
RANDOM_SEED = 0xFFFFFFFF


def _finite(x: float, lo: float, hi: float, default: float) -> float:
    return min(max(x, lo), hi) if math.isfinite(x) else default


def sanitize(p: SamplingParams) -> SamplingParams:
    """Clamp every value into the range llama.cpp's samplers accept.

    The router already rejects out-of-range values with a 400; this is the worker's own
    guard, because no frame, however it was built, may crash the worker.
    """
    return msgspec.structs.replace(
        p,
        temperature=_finite(p.temperature, 0.0, 100.0, 1.0),
        top_p=_finite(p.top_p, 0.0, 1.0, 1.0),
        top_k=max(0, p.top_k),
        min_p=_finite(p.min_p, 0.0, 1.0, 0.0),
        repeat_penalty=_finite(p.repeat_penalty, 1e-3, 100.0, 1.0),
        repeat_last_n=max(0, p.repeat_last_n),
        presence_penalty=_finite(p.presence_penalty, -100.0, 100.0, 0.0),
        frequency_penalty=_finite(p.frequency_penalty, -100.0, 100.0, 0.0),
    )


class SamplerChain:
    """Owns a native chain; free() must be called exactly once (the engine does, on finish)."""

    def __init__(self, p: SamplingParams, n_vocab: int) -> None:
        p = sanitize(p)
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if not chain:
            raise MemoryError("llama_sampler_chain_init failed")
        self._chain = chain
        self._argmax_vocab = 0  # > 0: plain greedy, sample by argmax over this many logits

        def add(sampler: llama_cpp.llama_sampler_p) -> None:
            llama_cpp.llama_sampler_chain_add(chain, sampler)

        penalised = (
            p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
        )
        with_penalties = penalised and p.repeat_last_n != 0
        if with_penalties:
            add(
                # The vendored llama.cpp still takes n_vocab first (see its llama.h).
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
                )
            )
        if p.temperature <= 0.0:
            add(llama_cpp.llama_sampler_init_greedy())
            # Plain greedy keeps no state, so argmax over the logits gives the same token
            # (both take the first maximum) without building a 262k-entry candidate array.
            self._argmax_vocab = 0 if with_penalties else n_vocab
            return
        if p.top_k > 0:
            add(llama_cpp.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1.0:
            add(llama_cpp.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            add(llama_cpp.llama_sampler_init_min_p(p.min_p, 1))
        add(llama_cpp.llama_sampler_init_temp(p.temperature))
        seed = RANDOM_SEED if p.seed is None else p.seed & 0xFFFFFFFF
        add(llama_cpp.llama_sampler_init_dist(seed))

    def sample(self, ctx: llama_cpp.llama_context_p, batch_index: int) -> int:
        """Sample and accept the next token from the logits at `batch_index`.

        The caller guarantees that the batch entry had its logits flag set; sampling anywhere
        else aborts the process.
        """
        if self._argmax_vocab:
            return int(logits_at(ctx, batch_index, self._argmax_vocab).argmax())
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, batch_index))

    def free(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
