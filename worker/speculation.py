"""Speculative decoding by n-gram lookup or a draft model, inside the engine's batched step.

A generating request feeds its last sampled token and, where there is room left in the
batch, up to `draft_max` draft tokens after it (worker/ngram_draft.py guesses them from the
prompt and the output so far; with a draft model, worker/draft_model.py drafts for every
generating request at once in `prepare`, before the step is built), all with logits.
After the one llama_decode of the step,
`verify` samples at the last token's index and then at each draft token's, in order, while
the model agrees with the draft. Each sample is drawn exactly as it would be without a
draft, by the same chain from the logits of the same context, so the output is identical,
only several tokens a step sooner where the guess was right (greedy or sampled alike: a
draft token is kept only when the model's own sample equals it). The cells of the draft
tokens after the first disagreement are given back through worker/kv_cache.py, so that the
slot keeps every sampled token but the last, as it does without speculation, and the
invariant check holds.

Requests whose every token needs its own logits treatment (a grammar, a logit bias,
logprobs) decode one token a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

from worker.kv_cache import KvCache
from worker.ngram_draft import Drafter
from worker.request import Request, pending_tokens
from worker.slots import Slot

from worker.draft_model import DraftModel, Want


class Speculation:
    def __init__(self, kv: KvCache, draft_max: int, n_ctx_slot: int, model: DraftModel | None = None) -> None:
        self.kv, self.draft_max, self.n_ctx_slot, self.model = kv, draft_max, n_ctx_slot, model
        self.drafted = 0  # draft tokens fed to llama_decode (Pong)
        self.accepted = 0  # of them, those the model's own samples agreed with

    def _drafter(self, req: Request) -> Drafter | None:
        if req.images and self.model is not None:
            return None  # a draft model has no projector: it cannot follow a prompt with images
        if req.drafter is None and not req.logit_adjustments() and req.logprobs is None:
            req.drafter = Drafter(self.draft_max)
        return req.drafter

    def _limit(self, req: Request, room: int) -> int:
        # Every accepted draft token is one more generated token and one more position.
        return min(room, req.max_new - req.n_gen - 1, self.n_ctx_slot - len(req.tokens) - 1)

    def prepare(self, slots: Sequence[Slot[Request]]) -> None:
        """With a draft model: its drafts for every request that feeds one sampled token
        this step, drafted together (the step then takes what fits)."""
        if self.model is None or self.draft_max <= 0:
            return
        asking: dict[int, Request] = {}
        wants = []
        for s in slots:
            req = s.request
            if req is not None:
                req.model_draft = []  # a draft not fed last step (no room) is stale now
            if req is None or req.n_gen == 0 or pending_tokens(s) != 1 or (d := self._drafter(req)) is None:
                continue
            limit = d.allowance(self._limit(req, self.draft_max))
            if limit > 0:
                asking[s.id] = req
                wants.append(Want(s.id, req.tokens, limit))
        for seq, draft in self.model.draft(wants).items():
            asking[seq].model_draft = draft

    def draft(self, req: Request, room: int) -> list[int]:
        """Up to `room` draft tokens after `req`'s last sampled one; none when speculation
        is off, the request cannot take drafts, or there is no guess."""
        if self.draft_max <= 0 or room <= 0:
            return []
        if self.model is not None:
            draft, req.model_draft = req.model_draft, []
            return draft[: max(0, self._limit(req, room))]
        d = self._drafter(req)
        limit = self._limit(req, room)
        draft = d.draft(req.tokens, limit) if d is not None and limit > 0 else []
        if req.images:  # an n-gram that continues into an image's placeholders stops there
            draft = draft[: next((i for i, t in enumerate(draft) if t < 0), len(draft))]
        return draft

    def verify(
        self, req: Request, slot: Slot[Request], start: int, index: int, draft: list[int],
        sample: Callable[[Request, int], None],
    ) -> None:
        """`req` fed its last sampled token at batch `index` (position `start`) and `draft`
        after it: sample in order while the model agrees, then give back the cells of the
        draft tokens it did not take. `sample(req, i)` samples and accepts at batch index
        `i`; a request that ends lets go of its slot."""
        assert req.drafter is not None
        matched = 0
        for j in range(len(draft) + 1):
            sample(req, index + j)
            if req.slot is None or j == len(draft) or req.tokens[-1] != draft[j]:
                break
            matched += 1
        req.drafter.verified(len(draft), matched)
        self.drafted += len(draft)
        self.accepted += matched
        # The last sampled token and the matched drafts before the next sample stay.
        keep = start + matched + 1
        if len(slot.cache) > keep:
            self.kv.keep(slot, keep)
