"""The sequences beyond the slots': parked entries and free sequence ids.

A model's context has `slots + cached_prompts` sequences. The slots' requests run in some of
them; the others are free (no cells at all) or parked: a finished prompt's cells kept under
a sequence of their own, with the tokens they hold, so that a later prompt can continue or
copy them (worker/prefix_reuse.py decides which). Parking a slot's contents costs nothing in
cells: the slot's sequence id becomes the entry's, and the slot takes a free id. Every change
to cells goes through worker/kv_cache.py, and the engine's invariant check covers parked
entries and free ids as it covers slots.
"""

from __future__ import annotations

import logging
from typing import Callable, Generic, Iterator, TypeVar

from worker.kv_cache import KvCache
from worker.prefix_reuse import eviction_order
from worker.slots import Slot

log = logging.getLogger("worker.kv")

R = TypeVar("R")


class Entries(Generic[R]):
    def __init__(self, kv: KvCache, first_id: int, n_seq_max: int) -> None:
        self.kv = kv
        self.free: list[int] = list(range(n_seq_max - 1, first_id - 1, -1))  # pop() gives the lowest
        self.parked: list[Slot[R]] = []
        self._empty: dict[int, Slot[R]] = {}  # a free id's stand-in for the check (`checked`)
        # What the entries did (GET /metrics): prompts whose prefix came from an entry, and
        # the prompt tokens they did not decode; entries given up for room or ids.
        self.hits = 0
        self.tokens_saved = 0
        self.evictions = 0
        # Told of each entry about to be evicted, while its cells are still there (the
        # prompt cache saves them to host memory: worker/prompt_cache.py).
        self.on_evict: Callable[[Slot[R]], None] | None = None

    @property
    def capacity(self) -> int:
        return len(self.free) + len(self.parked)

    def park(self, slot: Slot[R], clock: int) -> Slot[R] | None:
        """Move `slot`'s contents into an entry of their own, and give the slot an empty
        sequence. Returns the entry; None, the contents left in the slot, when the model
        keeps no entries."""
        if not self.capacity:
            return None
        self._free_one()
        entry: Slot[R] = Slot(seq_id=slot.seq_id, cache=slot.cache, last_used=clock, scope=slot.scope)
        slot.seq_id, slot.cache = self.free.pop(), []
        self.parked.append(entry)
        return entry

    def new_entry(self, clock: int) -> Slot[R] | None:
        """An empty parked entry, for cells about to be restored into it; None when the
        model keeps no entries."""
        if not self.capacity:
            return None
        self._free_one()
        entry: Slot[R] = Slot(seq_id=self.free.pop(), last_used=clock)
        self.parked.append(entry)
        return entry

    def _free_one(self) -> None:
        if not self.free:
            self.evict(eviction_order(self.parked)[0])

    def take(self, slot: Slot[R], entry: Slot[R], keep_old: bool, clock: int) -> None:
        """Give `slot` the sequence of parked `entry`; what the slot held becomes the entry
        when `keep_old`, else it is dropped and its id freed."""
        self.parked.remove(entry)
        slot.seq_id, entry.seq_id = entry.seq_id, slot.seq_id
        slot.cache, entry.cache = entry.cache, slot.cache
        slot.scope, entry.scope = entry.scope, slot.scope
        entry.anchor = False
        if keep_old and entry.cache:
            entry.last_used, entry.idle_steps = clock, 0
            self.parked.append(entry)
        else:
            self.kv.drop(entry)
            self.free.append(entry.seq_id)

    def anchor(self, source: Slot[R], n: int, clock: int) -> None:
        """Keep the first `n` cells of `source` as an anchor entry, if a sequence id is free
        (an anchor never evicts a conversation). The caller has checked `usable`."""
        if not self.free:
            return
        entry: Slot[R] = Slot(seq_id=self.free.pop(), last_used=clock, anchor=True)
        self.kv.copy_prefix(source, entry, n)
        self.parked.append(entry)

    def used(self, entry: Slot[R], tokens: int, clock: int) -> None:
        """`entry` gave a prompt `tokens` of its cells."""
        entry.last_used, entry.idle_steps = clock, 0
        self.hits += 1
        self.tokens_saved += tokens

    def age(self, steps: int) -> None:
        """`steps` decode steps went by."""
        for entry in self.parked:
            entry.idle_steps += steps

    def evict(self, entry: Slot[R]) -> None:
        if self.on_evict is not None:
            self.on_evict(entry)
        self.kv.drop(entry)
        self.forget(entry)
        self.evictions += 1

    def forget(self, entry: Slot[R]) -> None:
        """`entry`'s cells are gone (evicted, or dropped by the invariant check)."""
        if entry in self.parked:
            self.parked.remove(entry)
            self.free.append(entry.seq_id)

    def checked(self) -> Iterator[Slot[R]]:
        """What the invariant check compares besides the slots: each parked entry, and each
        free id as an empty sequence (it must hold no cells). Called every step: the empty
        stand-ins are made once."""
        yield from self.parked
        for seq in self.free:
            empty = self._empty.get(seq)
            if empty is None:
                empty = self._empty[seq] = Slot(seq_id=seq)
            yield empty

    def clear(self) -> None:
        for entry in list(self.parked):
            self.kv.drop(entry)
            self.forget(entry)
