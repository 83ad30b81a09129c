"""Admission: waiting requests into idle slots, each slot's KV cells made ready for its
request first.

Which slot is pure (worker/slots.py: the longest prefix its own cache can still give, then
the least recently used); where the prompt's cached prefix comes from is pure too
(worker/prefix_reuse.py: the slot's own cells, a parked entry's, another slot's, or those of
a request still prefilling the same prefix, waited for), and so is how a sibling of an
n > 1 request starts (worker/siblings.py: join choice 0's prompt evaluation). This module
performs those decisions through worker/kv_cache.py and worker/kv_entries.py, which keep
each sequence's books and its cells in step. A request preempted for KV space waits while
the cache is still full and other requests run, so that it is not re-admitted only to be
preempted again.

Every choice sees only the sequences of the request's cache scope (Request.scope: one per
key or key group, router/server/cache_scope.py): another scope's cells are never reused,
copied or waited for, and a slot that held them parks them before it takes the request.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import msgspec

from worker.kv_cache import KvCache
from worker.kv_entries import Entries
from worker.outcomes import Requests
from worker.prefix_reuse import Prefilling, Start, follow_target, plan_start, wants_anchor
from worker.prompt_cache import PromptCache
from worker.protocol import SamplingParams
from worker.request import Request
from worker.sampling import SamplerChain
from worker.slots import Slot, choose_slot, scoped

log = logging.getLogger("worker.engine")


class Admission:
    def __init__(
        self,
        slots: list[Slot[Request]],
        kv: KvCache,
        entries: Entries[Request],
        requests: Requests,
        n_vocab: int,
        n_ctx_slot: int,
        active: Callable[[], int],
        cache: PromptCache | None = None,
    ) -> None:
        self.slots, self.kv, self.entries, self.requests, self.cache = slots, kv, entries, requests, cache
        self.n_vocab, self.n_ctx_slot, self.active = n_vocab, n_ctx_slot, active
        self.clock = 0  # a slot's or an entry's last use, for LRU choices
        # Prompts admitted with some of their tokens read from the cache and without, and
        # the tokens read (GET /metrics: worker/link.py sends them with each Pong).
        self.reused = self.missed = self.tokens_reused = 0
        # Tokens a preempted or parked request found again in the cache when it came back.
        self.tokens_resumed = 0

    def admit(self) -> None:
        """Move waiting requests into idle slots, reusing the best cached prefix."""
        waiting = self.requests.waiting
        while waiting:
            req = waiting[0]
            if req.preempted and self.requests.kv_full and self.active():
                return
            slot = choose_slot(self.slots, req.tokens, scoped(self.kv.usable, req.scope))
            if slot is None:
                return
            waiting.popleft()
            self.clock += 1
            keep = self._start_in(slot, req)
            slot.scope = req.scope  # what it holds now is the request's prefix, or nothing
            if req.sampler is not None:  # a request that lost its slot, back
                self.tokens_resumed += keep
            else:
                req.cached = keep
                self._count(keep)
                try:
                    req.sampler = SamplerChain(self._resolved(req.params), self.n_vocab)
                except Exception as exc:
                    log.exception("sampler chain for request %s", req.label)
                    self.requests.error(req, "internal", f"could not build the sampler: {exc}")
                    continue
                if req.follows is None:
                    self._follow(slot, req, keep)
            slot.last_used = self.clock
            slot.request = req
            req.slot = slot
            if not req.t_admitted:  # a preempted request keeps its first start
                req.t_admitted = time.perf_counter()

    def _count(self, cached: int) -> None:
        if cached > 0:
            self.reused += 1
            self.tokens_reused += cached
        else:
            self.missed += 1

    def _start_in(self, slot: Slot[Request], req: Request) -> int:
        """Make `slot`'s cache ready for `req`; returns the prompt tokens it need not
        decode."""
        if req.index > 0:
            leader = self.requests.leader(req)
            if leader is not None and leader.slot is not None and leader.n_gen == 0 and req.n_gen == 0:
                # Its cells come from the leader once the prompt is decoded (`join`).
                self._set_aside(slot)
                req.follows = leader
                return 0
        if self.cache is not None:
            # A saved prompt that serves this one better than the KV cache does comes back
            # as a parked entry, which the choice below then takes.
            self.cache.promote(req.tokens, [*self.slots, *self.entries.parked], self.clock, req.scope)
        others = [s for s in self.slots if s is not slot and s.scope == req.scope]
        parked = [e for e in self.entries.parked if e.scope == req.scope]
        usable = scoped(self.kv.usable, req.scope)
        start = plan_start(slot, others, parked, req.tokens, usable, bool(self.entries.free))
        return self._perform(slot, start)

    def _set_aside(self, slot: Slot[Request]) -> None:
        """Empty `slot`'s sequence, parking what it held."""
        if not slot.cache or self.entries.park(slot, slot.last_used) is None:
            self.kv.drop(slot)

    def _perform(self, slot: Slot[Request], start: Start[Request]) -> int:
        source, n = start.source, start.n
        if start.take:
            assert source is not None
            self.entries.take(slot, source, start.park, self.clock)
            self.entries.used(slot, n, self.clock)
            return self.kv.keep(slot, n)
        if start.park:
            parked = self.entries.park(slot, slot.last_used)
            if source is None:
                source = parked  # copy the slot's own prefix back from where it went
        if source is None:
            return self.kv.keep(slot, n)  # never more than the KV cache still holds (kv_rules.py)
        if start.anchor:
            self.entries.anchor(source, n, self.clock)
        if n <= 0:
            self.kv.drop(slot)
            return 0
        n = self.kv.copy_prefix(source, slot, n)
        if source in self.entries.parked:
            self.entries.used(source, n, self.clock)
        return n

    def _follow(self, slot: Slot[Request], req: Request, keep: int) -> None:
        """Let `req` wait for a request still prefilling a longer shared prefix."""
        prefilling = [
            Prefilling(s, r.tokens)
            for s in self.slots
            if (r := s.request) is not None and r.n_gen == 0 and r.follows is None and r.awaits is None
            and r.scope == req.scope
        ]
        target = follow_target(req.tokens, keep, prefilling)
        if target is not None:
            req.awaits, req.await_n = target[0].request, target[1]

    # ---- copies made at a step, for requests admitted earlier (the engine calls these) ----

    def join(self, leader: Request, f: Request) -> None:
        """Give sibling `f` the leader's prompt cells, in the step that completed the
        prompt: in a unified KV cache a copy tags the same cells with another sequence id,
        so nothing is decoded again."""
        assert f.slot is not None and leader.slot is not None
        n = len(leader.prompt)
        self._copied(f, self.kv.copy_prefix(leader.slot, f.slot, n))
        f.follows = None

    def copy_awaited(self, f: Request) -> None:
        """`f` waits for another request to decode a prefix they share: copy it once that
        request's cache holds it, or stop waiting when it never will (it lost its slot, or
        the sliding window's cells for that prefix are gone)."""
        assert f.slot is not None and f.awaits is not None
        lead, n = f.awaits, f.await_n
        source = lead.slot
        if source is None or source.request is not lead:
            f.awaits = None  # it prefills the rest itself from this step on
            return
        if len(source.cache) < n:
            return
        f.awaits = None
        if self.kv.usable(source, n) < n:
            return
        if wants_anchor([e for e in self.entries.parked if e.scope == f.scope], f.tokens, n):
            self.entries.anchor(source, n, self.clock)
        self._copied(f, self.kv.copy_prefix(source, f.slot, n))

    def _copied(self, f: Request, n: int) -> None:
        """`f`, admitted with `f.cached` tokens from the cache, got `n` at a step."""
        self.tokens_reused += n - f.cached
        if f.cached == 0:
            self.reused, self.missed = self.reused + 1, self.missed - 1
        f.cached = n

    def _resolved(self, p: SamplingParams) -> SamplingParams:
        # llama-server's convention: repeat_last_n = -1 means the whole context.
        if p.repeat_last_n == -1:
            return msgspec.structs.replace(p, repeat_last_n=self.n_ctx_slot)
        return p
