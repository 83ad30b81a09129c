"""The logits a request samples from: logit_bias applied in place, and logprobs read from
the very same buffer (the edits themselves are worker/logits.py's).

llama.cpp's samplers read the logits through `llama_get_logits_ith`, which hands out a
writable pointer into the context's output buffer. Editing that buffer before the chain
samples (a bias here; a constraint's token mask elsewhere) is therefore seen by every
sampler, the numpy-argmax greedy path included, and logprobs computed from the buffer after
sampling describe exactly the distribution the sampler drew from (before temperature and
truncation, as OpenAI's logprobs are the model's, not the sampler's).

n > 1 choices sample their first token at one batch index: `StepLogits` keeps the untouched
logits of such an index so that each choice starts from them, and one choice's edits never
leak into another's.

`LogprobQueue` is pure: it holds a request's logprobs back for as long as the text of
their tokens is held back (an incomplete UTF-8 character, a possible stop string), so a
client gets the logprobs of exactly the tokens whose text reached it.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import llama_cpp
import numpy as np

from worker.logits import logits_at
from worker.protocol import TokenLogprob, TopLogprob


def log_softmax_at(logits: np.ndarray, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of `token`, and the `k` most likely tokens with theirs (most
    likely first), under softmax(logits). One pass over the vocabulary: about 1 ms for
    262k logits on this project's CPU (1.4 ms with k = 5, 1.6 ms with k = 20)."""
    m = float(logits.max())
    if not np.isfinite(m):  # every token banned: no distribution, say so with -inf below
        m = 0.0
    # float64 sum: 262k float32 terms would lose digits that a logprob near 0 shows.
    lse = m + float(np.log(np.sum(np.exp(logits - m), dtype=np.float64)))
    top: list[tuple[int, float]] = []
    if k > 0:
        k = min(k, logits.shape[0])
        cand = np.argpartition(logits, -k)[-k:]
        cand = cand[np.argsort(-logits[cand], kind="stable")]
        top = [(int(t), float(logits[t]) - lse) for t in cand]
    return float(logits[token]) - lse, top


def token_logprob(logits: np.ndarray, token: int, k: int, piece: Callable[[int], bytes]) -> TokenLogprob:
    """The wire form of one generated token's logprobs."""
    lp, top = log_softmax_at(logits, token, k)
    return TokenLogprob(
        token=token,
        piece=piece(token),
        logprob=_finite(lp),
        top=[TopLogprob(token=t, piece=piece(t), logprob=_finite(v)) for t, v in top],
    )


def _finite(x: float) -> float:
    # A banned token (-inf logit) has logprob -inf, which JSON cannot carry: OpenAI
    # clients read -9999 as "never" (its API reports that value for such tokens).
    return x if np.isfinite(x) else -9999.0


class StepLogits:
    """One step's sampling positions, so that choices sharing a batch index each start
    from its untouched logits. Used for one step, then dropped."""

    def __init__(self, ctx: llama_cpp.llama_context_p, n_vocab: int, shared: set[int]) -> None:
        self._ctx, self._n_vocab, self._shared = ctx, n_vocab, shared
        self._pristine: dict[int, np.ndarray] = {}

    def shared(self, batch_index: int) -> bool:
        """Whether several choices sample at `batch_index`."""
        return batch_index in self._shared

    def fresh(self, batch_index: int) -> np.ndarray:
        """The logits at `batch_index` as the decode left them, writable in place."""
        view = logits_at(self._ctx, batch_index, self._n_vocab)
        if batch_index in self._shared:
            saved = self._pristine.get(batch_index)
            if saved is None:
                self._pristine[batch_index] = view.copy()  # 1 MB, once per shared index
            else:
                view[:] = saved
        return view


class LogprobQueue:
    """A request's logprobs, released as the text of their tokens is.

    Each token is pushed with the number of characters its piece added to the decoded
    text (0 for the first bytes of a character that is not yet complete). Text leaves in
    order, possibly later than its token; `release(n)` is told how many characters just
    left and returns the logprobs of the tokens whose text has now left whole.
    """

    def __init__(self) -> None:
        self._held: deque[tuple[int, TokenLogprob]] = deque()  # (text end, logprob)
        self._pushed = 0  # characters decoded so far
        self._sent = 0  # characters emitted so far

    def push(self, entry: TokenLogprob, n_chars: int) -> None:
        self._pushed += n_chars
        # A token that completed no character yet leaves with the one a later token
        # completes: its end is at least the next character.
        self._held.append((self._pushed if n_chars else self._pushed + 1, entry))

    def release(self, n_chars: int) -> list[TokenLogprob]:
        self._sent += n_chars
        out: list[TokenLogprob] = []
        while self._held and self._held[0][0] <= self._sent:
            out.append(self._held.popleft()[1])
        return out

    def release_all(self) -> list[TokenLogprob]:
        """Generation ended for a reason other than a stop string: every token's text went
        out (the decoder's and the stop matcher's held text were flushed)."""
        out = [e for _, e in self._held]
        self._held.clear()
        return out

    def drop(self) -> None:
        """A stop string matched: the tokens still held made (part of) the stop string,
        which is not content."""
        self._held.clear()
