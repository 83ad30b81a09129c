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
            self.requests.waiting.appendleft(req)
            log.info("KV cache full: preempted request %s (%d tokens, resumes later)", req.label, len(req.tokens))
        return remedy

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
