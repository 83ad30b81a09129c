"""What the engine does when the KV cache has no room or no longer agrees with the books:
perform step_plan's remedy for a full cache (give up parked entries, then idle slots' caches,
each saved to host memory first; then preempt), fail a batch llama.cpp refused, and redo a
request whose cells the invariant check dropped. The decisions are pure
(worker/step_plan.py, worker/prefix_reuse.py); this module acts on the sequences through
worker/kv_cache.py and worker/kv_entries.py."""

from __future__ import annotations

import logging

from worker.kv_cache import KvCache
from worker.kv_entries import Entries
from worker.outcomes import Requests
from worker.prefix_reuse import eviction_order
from worker.priority import Running, to_make_way
from worker.prompt_cache import PromptCache
from worker.request import Request
from worker.slots import Slot
from worker.step_plan import Preempt, Purge, Remedy, make_room

log = logging.getLogger("worker.engine")


class KvRoom:
    def __init__(
        self, slots: list[Slot[Request]], kv: KvCache, entries: Entries[Request], cache: PromptCache, requests: Requests
    ) -> None:
        self.slots, self.kv, self.entries, self.cache, self.requests = slots, kv, entries, cache, requests
        self.parked = 0  # requests parked for a better class (GET /metrics)

    def make_room(self, batch_tokens: int) -> Remedy[Request]:
        """After llama_decode returned 1 (no KV space): perform what make_room decides."""
        remedy = make_room(
            self.slots, batch_tokens,
            lambda s: s.request is not None and (s.request.follows is not None or s.request.awaits is not None),
            eviction_order(self.entries.parked),
        )
        if isinstance(remedy, Purge):
            for s in remedy.slots:
                if s in self.entries.parked:
                    self.entries.evict(s)
                else:
                    self.cache.spill(s, s.last_used)
                    self.kv.drop(s)
        elif isinstance(remedy, Preempt):
            victim = remedy.slot
            req = victim.request
            assert req is not None
            self.kv.drop(victim)
            victim.request = None
            req.slot = None
            req.follows = req.awaits = None
            req.preempted = True
            self.requests.kv_full = True
            self.requests.requeue(req)
            log.info("KV cache full: preempted request %s (%d tokens, resumes later)", req.label, len(req.tokens))
        return remedy

    def make_way(self, clock: int) -> None:
        """Park the running requests that waiting ones of a better class displace. Not
        while a request preempted for KV room waits: it holds the line until room comes."""
        if self.requests.kv_full:
            return
        running = [
            None if (r := s.request) is None else Running(
                r.rank, r.t_admitted, r.follows is None and r.awaits is None and not (r.images and r.n_gen == 0)
            )
            for s in self.slots
        ]
        for i in to_make_way([w.rank for w in self.requests.waiting], running):
            self.park(self.slots[i], clock)

    def park(self, slot: Slot[Request], clock: int) -> None:
        """Take `slot` back from its request for a waiting one of a better class
        (worker/priority.py): the request's cells become a parked entry of its scope (or go
        to host memory, where the model keeps no entries), and it waits at the front of its
        class. Re-admitted, it finds them as any prompt finds a cached prefix, and goes on
        from its last sampled token: its sampler, grammar, stop matcher and output so far
        never left it."""
        req = slot.request
        assert req is not None
        if slot.cache and self.entries.park(slot, clock) is None:
            self.cache.spill(slot, clock)
            self.kv.drop(slot)
        slot.request = None
        req.slot = None
        req.preempted = True
        self.parked += 1
        self.requests.requeue(req)
        log.info("request %s parked (%d tokens) for a request of a better class", req.label, len(req.tokens))

    def fail_plan(self, plan: list[Request], rc: int) -> None:
        """llama_decode refused a batch with `rc`: end each of its requests."""
        for req in plan:
            if rc == 1:
                # A single request filled the whole pool: that is its context limit. A decode
                # that found no room placed nothing, so its cache is as the books say.
                self.requests.finish(req, "length", events=None, flush=True, stop_type="limit")
            else:
                # llama.cpp keeps the ubatches that succeeded before one failed: the cells no
                # longer match the books.
                if req.slot is not None:
                    self.kv.drop(req.slot)
                self.requests.error(req, "internal", f"llama_decode failed with {rc}")

    def dropped(self, seq: Slot[Request]) -> None:
        """The invariant check dropped `seq`'s cells: a slot's request decodes again, a
        parked entry is gone."""
        if seq.id >= 0:
            self._redo(seq)
        else:
            self.entries.forget(seq)

    def _redo(self, slot: Slot[Request]) -> None:
        """`slot`'s cells were dropped by the invariant check: its request, if any, decodes
        its tokens (prompt and output so far) again, as a preempted one does, and its
        output goes on where it was."""
        req = slot.request
        if req is None or req.follows is not None:
            return
        if req.kv_redone:
            # Dropped twice: something keeps breaking its cells, and a third try would only
            # loop. It ends with an error rather than an answer from a wrong cache.
            self.requests.error(req, "internal", "the KV cache did not hold this request's tokens (logged)")
            return
        req.kv_redone = True
        req.cached = 0
        log.error("request %s decodes its %d tokens again", req.label, len(req.tokens))
