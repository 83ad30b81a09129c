"""The KV cache and the slots' books of it, changed together.

A slot's `cache` lists the tokens it believes its sequence holds; llama.cpp's memory holds
the cells. Every operation that changes one changes the other here, in one place: keeping
a prefix, copying a sibling's prompt, dropping a sequence, and what a decode added. What
the cells must hold is decided in worker/kv_rules.py; this module asks llama.cpp where a
sequence's cells start and end, and acts.

`check` compares the two for every slot, each step, before the batch is decoded. It costs
two calls per slot that return a map's first and last key (one for a free sequence). A
slot that disagrees has its sequence dropped (its request, if any, decodes its tokens
again, as a preempted one does), the fact is logged as an error and counted (`repairs`,
exported as corral_model_kv_repairs): it means a bug, and is never served from.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence, TypeVar

import llama_cpp

from worker.adapter_turns import owner_scope
from worker.kv_positions import last_position, position, whole
from worker.kv_rules import Attention
from worker.slots import Slot

log = logging.getLogger("worker.kv")

R = TypeVar("R")


class KvCache:
    def __init__(self, memory: llama_cpp.llama_memory_t, attention: Attention) -> None:
        self.memory = memory
        self.attention = attention
        # Slots whose books disagreed with the cells and were dropped: each one is a bug.
        self.repairs = 0
        # Cached prefixes that matched a prompt but could not be kept, because the sliding
        # window's cells no longer reach down to them: the prompt was decoded again.
        self.prefixes_refused = 0
        # The LoRA set the context decodes under, as the suffix it gives a scope
        # (worker/adapter_turns.py), and the decodes that placed cells in a sequence of
        # another set's scope: each one is a bug, a prefix of one adapter set served to
        # another (the suite asserts none).
        self.under: Callable[[], str] | None = None  # set by a model with adapters only
        self.sets_crossed = 0

    # ---- questions ----------------------------------------------------------------------------

    def span(self, slot: Slot[R]) -> tuple[int, int]:
        """The lowest and highest position llama.cpp holds for `slot`'s sequence (-1, -1:
        none). For a sliding-window model, those of its sliding-window cache."""
        seq = slot.seq_id
        return (
            int(llama_cpp.llama_memory_seq_pos_min(self.memory, seq)),
            int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq)),
        )

    def position(self, tokens: Sequence[int], k: int) -> int:
        """The position of a sequence's token at index `k`, or of the next one after the
        first `k`: `k`, but past an M-RoPE image (worker/kv_positions.py)."""
        return position(tokens, k, self.attention.mrope)

    def _problem(self, tokens: Sequence[int], pos_min: int, pos_max: int) -> str | None:
        if not self.attention.mrope:
            return self.attention.problem(len(tokens), pos_min, pos_max)
        return self.attention.problem(self.position(tokens, len(tokens)), pos_min, pos_max, last_position(tokens, True))

    def usable(self, slot: Slot[R], n: int) -> int:
        """How many of `slot`'s first `n` cached tokens can really be kept: `n`, or 0 when
        the cells no longer reach down to what a prefix that short needs."""
        if n <= 0 or n >= len(slot.cache):
            return max(n, 0)
        pos_min, _ = self.span(slot)
        return n if self.attention.keepable(n, len(slot.cache), pos_min) else 0

    # ---- changes, each to both layers -----------------------------------------------------------

    def drop(self, slot: Slot[R]) -> None:
        """Forget `slot`'s sequence entirely."""
        llama_cpp.llama_memory_seq_rm(self.memory, slot.seq_id, -1, -1)
        slot.cache.clear()

    def keep(self, slot: Slot[R], n: int) -> int:
        """Keep the first `n` tokens of `slot`'s sequence, or as many as can be (`usable`);
        returns how many were kept."""
        n = min(n, len(slot.cache))
        if self.attention.mrope:  # an M-RoPE image's cells share one position: all or none
            n = whole(slot.cache, n)
        kept = self.usable(slot, n)
        if kept < n:
            self.prefixes_refused += 1
            log.debug(
                "slot %d: its first %d tokens cannot be kept (sliding-window cells start at %d); "
                "decoding the prompt again", slot.seq_id, n, self.span(slot)[0],
            )
        if kept == len(slot.cache):
            return kept
        if kept == 0 or not llama_cpp.llama_memory_seq_rm(self.memory, slot.seq_id, self.position(slot.cache, kept), -1):
            # A recurrent memory refuses to remove part of a sequence: drop it whole.
            self.drop(slot)
            return 0
        del slot.cache[kept:]
        return kept

    def copy_prefix(self, source: Slot[R], target: Slot[R], n: int) -> int:
        """Make `target`'s sequence the first `n` tokens of `source`'s. In a unified KV
        cache a copy only tags the same cells with a second sequence id. The caller has
        checked `usable(source, n)`. Returns how many were copied."""
        if self.attention.mrope:
            n = whole(source.cache, n)
        llama_cpp.llama_memory_seq_rm(self.memory, target.seq_id, -1, -1)
        llama_cpp.llama_memory_seq_cp(self.memory, source.seq_id, target.seq_id, 0, self.position(source.cache, n))
        target.cache[:] = source.cache[:n]
        target.scope = source.scope
        return n  # less than asked only where `n` would have cut an M-RoPE image

    def restore(self, slot: Slot[R], tokens: Sequence[int], write: Callable[[int], bool], scope: str = "") -> bool:
        """Make `slot`'s sequence a saved one: `write(seq_id)` puts the saved cells into the
        empty sequence (llama_state_seq_set_data); the books become `tokens` (of cache scope
        `scope`) only when the cells read span exactly those tokens, as the invariant
        demands. Otherwise (no room for them, a state from another context) the sequence is
        left empty: False."""
        self.drop(slot)
        if not write(slot.seq_id):
            self.drop(slot)
            return False
        pos_min, pos_max = self.span(slot)
        problem = self._problem(tokens, pos_min, pos_max)
        if problem is not None:
            log.warning("a saved prompt's cells do not match its %d tokens (%s): not restored", len(tokens), problem)
            self.drop(slot)
            return False
        slot.cache[:] = tokens
        slot.scope = scope
        return True

    def decoded(self, slot: Slot[R], tokens: Sequence[int]) -> None:
        """A decode that succeeded placed `tokens` after `slot`'s cached ones."""
        # (a model without adapters pays nothing here: this runs per slot, every step)
        if self.under is not None and (under := self.under()) != slot.scope[len(owner_scope(slot.scope)):]:
            self.sets_crossed += 1
            log.error("slot %d: cells decoded under LoRA set %r in a sequence of scope %r", slot.seq_id, under, slot.scope)
        slot.cache.extend(tokens)

    # ---- the invariant ----------------------------------------------------------------------

    def check(self, slots: Sequence[Slot[R]], on_drop: Callable[[Slot[R]], None]) -> int:
        """Compare every slot's books with its cells; drop each sequence that disagrees and
        tell `on_drop` (its request, if any, must decode its tokens again). Returns how many
        were dropped."""
        dropped = 0
        for slot in slots:
            if not slot.cache and llama_cpp.llama_memory_seq_pos_max(self.memory, slot.seq_id) == -1:
                continue  # an empty book agrees only with no cells, which one call tells
            pos_min, pos_max = self.span(slot)
            problem = self._problem(slot.cache, pos_min, pos_max)
            owner = getattr(slot.request, "scope", slot.scope)  # (a request's, where one runs)
            if problem is None and slot.cache and owner != slot.scope:
                problem = f"it holds cells of scope {slot.scope!r} for a request of scope {owner!r}"
            if problem is None:
                continue
            self.repairs += 1
            dropped += 1
            log.error("KV invariant violated for slot %d: %s; dropping its cache", slot.seq_id, problem)
            self.drop(slot)
            on_drop(slot)
        return dropped
