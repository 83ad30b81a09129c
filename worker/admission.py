"""Admission: waiting requests into idle slots, each slot's KV cells made ready for its
request first.

Which slot is pure (worker/slots.py: the longest prefix the KV cache can still give, then
the least recently used); how a sibling of an n > 1 request starts is pure too
(worker/siblings.py: join choice 0's prompt evaluation, or copy a prefix another slot
holds). This module performs those decisions through worker/kv_cache.py, which keeps each
slot's books and its cells in step. A request preempted for KV space waits while the cache
is still full and other requests run, so that it is not re-admitted only to be preempted
again.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import msgspec

from worker.kv_cache import KvCache
from worker.outcomes import Requests
from worker.protocol import SamplingParams
from worker.request import Request
from worker.sampling import SamplerChain
from worker.siblings import CopyPrefix, Join, sibling_start
from worker.slots import Slot, choose_slot, reusable_prefix

log = logging.getLogger("worker.engine")


class Admission:
    def __init__(
        self,
        slots: list[Slot[Request]],
        kv: KvCache,
        requests: Requests,
        n_vocab: int,
        n_ctx_slot: int,
        active: Callable[[], int],
    ) -> None:
        self.slots, self.kv, self.requests = slots, kv, requests
        self.n_vocab, self.n_ctx_slot, self.active = n_vocab, n_ctx_slot, active
        self._clock = 0  # a slot's last use, for choose_slot's LRU

    def admit(self) -> None:
        """Move waiting requests into idle slots, reusing the best cached prefix."""
        waiting = self.requests.waiting
        while waiting:
            req = waiting[0]
            if req.preempted and self.requests.kv_full and self.active():
                return
            slot = choose_slot(self.slots, req.tokens, self.kv.usable)
            if slot is None:
                return
            waiting.popleft()
            keep = self._start_in(slot, req)
            if req.sampler is None:
                req.cached = keep
                try:
                    req.sampler = SamplerChain(self._resolved(req.params), self.n_vocab)
                except Exception as exc:
                    log.exception("sampler chain for request %s", req.label)
                    self.requests.error(req, "internal", f"could not build the sampler: {exc}")
                    continue
            self._clock += 1
            slot.last_used = self._clock
            slot.request = req
            req.slot = slot
            if not req.t_admitted:  # a preempted request keeps its first start
                req.t_admitted = time.perf_counter()

    def _start_in(self, slot: Slot[Request], req: Request) -> int:
        """Make `slot`'s cache ready for `req` (as sibling_start and the prefix rules say);
        returns the prompt tokens it need not decode."""
        start = None
        if req.index > 0:
            leader = self.requests.leader(req)
            prefilling = (
                leader is not None and leader.slot is not None and leader.n_gen == 0 and req.n_gen == 0
            )
            start = sibling_start(prefilling, self.slots, slot, req.tokens, self.kv.usable)
        if isinstance(start, Join):
            # Its cells come from the leader once the prompt is decoded (Engine._join).
            self.kv.drop(slot)
            req.follows = self.requests.leader(req)
            return 0
        if isinstance(start, CopyPrefix):
            self.kv.copy_prefix(start.source, slot, start.n)
            return start.n
        # Never more than the KV cache still holds for that prefix (kv_rules.py).
        return self.kv.keep(slot, reusable_prefix(slot.cache, req.tokens))

    def _resolved(self, p: SamplingParams) -> SamplingParams:
        # llama-server's convention: repeat_last_n = -1 means the whole context.
        if p.repeat_last_n == -1:
            return msgspec.structs.replace(p, repeat_last_n=self.n_ctx_slot)
        return p
