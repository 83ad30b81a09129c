"""Running ahead: a lone stream's steps back to back, without the engine loop's rounds.

When one request generates and nothing else is at work or waiting, every step is the same:
feed its last sampled token (and an n-gram draft, when there is one), decode, sample. The
engine loop around such a step (the inbox, admission, the check of every sequence, the
siblings, the batch plan, occupancy, the prompt cache's clock) costs about 280 µs a token
between two decodes on a 2-core machine: 2% of a 13 ms step of the demo model, and most of
it cache misses, since each decode streams the model's weights through every cache.
`RunAhead` takes such steps in a tight loop instead (measured back to back, 12 greedy
streams of 128 tokens each way: 276 and 280 µs between decodes without it, 187 and 208 with
it; the argmax over 262,144 logits is 60 of them), and goes back to the engine loop as
soon as that loop has something to do:

  - a frame reached the inbox (a new request, a cancel, a command): at most one step late;
  - the request ended;
  - a decode did not succeed: nothing was changed, and the engine's full step decodes the
    same batch again, making room when the KV cache is full;
  - LIMIT steps went by, so that the full step's checks still run regularly.

Each step keeps what a full step does for this request, in the same order: the KV invariant
check of its slot before the decode (a decode adds cells only for the sequences in its
batch, so the others' cells cannot have changed since the full step checked them), the
books of what was decoded (`KvCache.decoded`), drafts and their verification, and each
sampled token through `Requests.accept`. Events leave at every step for a streaming client,
and once at the end for one that reads the answer whole (worker/event_hold.py).
"""

from __future__ import annotations

from typing import Callable, Sequence

import llama_cpp

from worker.adapter_turns import AdapterSet
from worker.batch import BatchBuffer
from worker.event_hold import EventHold
from worker.kv_cache import KvCache
from worker.outcomes import Requests
from worker.protocol import Step, TokenEvent
from worker.request import Request, pending_tokens
from worker.slots import Slot
from worker.speculation import Speculation

LIMIT = 32  # steps before the engine loop runs its full step again


def lone_request(slots: Sequence[Slot[Request]], waiting: bool, draft_model: bool) -> Request | None:
    """The request that may run ahead: the only one at work, nothing waiting for a slot,
    already generating (its one sampled token pending), and sampling from its own logits
    untouched (no grammar, bias or logprobs, no sibling sharing them). A draft model drafts
    for all slots at once in the full step, so it keeps every request there."""
    if waiting or draft_model:
        return None
    found: Request | None = None
    for s in slots:
        if s.request is not None:
            if found is not None:
                return None
            found = s.request
    r = found
    if r is None or r.slot is None or r.n_gen == 0 or pending_tokens(r.slot) != 1:
        return None
    if r.matcher is not None or r.logprobs is not None or r.logit_adjustments():
        return None
    return r


class RunAhead:
    def __init__(
        self,
        ctx: llama_cpp.llama_context_p,
        batch: BatchBuffer,
        kv: KvCache,
        requests: Requests,
        spec: Speculation,
        idle: Callable[[], bool],
        emit: EventHold,
        apply: Callable[[AdapterSet], None] = lambda _: None,
    ) -> None:
        self.ctx, self.batch, self.kv, self.requests, self.spec = ctx, batch, kv, requests, spec
        # Makes the request's LoRA set the context's (worker/adapters.py): the step before
        # may have served another set whose last request just ended.
        self.apply = apply
        self.idle = idle  # nothing in the engine's inbox
        self.emit = emit  # the engine's: it knows whose events wait for their end
        self.limit = LIMIT  # steps at most before the loop's full step (0: never run ahead)
        self.steps = 0  # decodes done running ahead

    def run(self, req: Request, on_drop: Callable[[Slot[Request]], None]) -> int:
        """Steps for `req` (from `lone_request`) until the engine loop is needed; returns
        how many decodes succeeded. `on_drop` is the engine's for a slot the check drops."""
        slot = req.slot
        assert slot is not None and req.sampler is not None
        held = self.emit.holds(req.id)
        self.apply(req.adapters)
        events: list[TokenEvent] = []
        done = 0
        while done < self.limit and self.idle() and req.slot is slot:
            if self.kv.check([slot], on_drop) or pending_tokens(slot) != 1:
                break
            start = len(slot.cache)
            draft = self.spec.draft(req, self.batch.capacity - 1)
            fed = req.tokens[start:] + draft
            self.batch.clear()
            index = self.batch.add(fed, self.kv.position(slot.cache, start), slot.seq_id, "all" if draft else "last")
            if llama_cpp.llama_decode(self.ctx, self.batch.struct()) != 0:
                break
            done += 1
            self.kv.decoded(slot, fed)
            if draft:
                self.spec.verify(req, slot, start, index, draft, lambda r, i: self._sample(r, i, events))
            else:
                self._sample(req, index, events)
            if events and not held:
                self.emit(Step(events=events))
                events = []
        if events:
            self.emit(Step(events=events))
        self.steps += done
        return done

    def _sample(self, req: Request, index: int, events: list[TokenEvent]) -> None:
        assert req.sampler is not None
        self.requests.accept(req, req.sampler.sample(self.ctx, index), events)
