"""Where a new prompt's cached prefix comes from, what is kept for later prompts, and what is
given up first: pure decisions over sequences, which admission (worker/admission.py) and the
engine perform through worker/kv_cache.py.

The KV cache is unified: every sequence draws its cells from one pool, and
`llama_memory_seq_cp` copies a sequence's prefix into another by tagging the same cells with
a second sequence id, at no cost in cells or time. So a prompt's prefix may come from any
sequence that holds it:

- the slot's own sequence (what its last request left);
- a parked entry: a finished conversation kept under a sequence of its own after its slot was
  taken by another one (there are more sequences than slots: `cached_prompts`), so that a
  user who comes back finds it even when other users took every slot;
- another slot's sequence, busy or idle (the shared system prompt another user's request
  holds);
- a request still prefilling the same prefix: the new one waits for it (`follow_target`) and
  then copies, instead of decoding the same system prompt in parallel.

A slot whose cache holds much that the new prompt cannot use is parked first, not
overwritten. A prefix copied from another conversation is shared by at least two of them:
it is also kept as an anchor entry of its own, evicted last, because a sequence that ends
where the prefix ends is one whose sliding-window cells for that prefix llama.cpp never
gives away (worker/kv_rules.py): a longer sequence may lose them once they leave its
window, and with them the means to copy a shorter prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Sequence, TypeVar

from worker.slots import Slot, Usable, all_usable, common_prefix, reusable_prefix

R = TypeVar("R")

# Cached tokens beyond what a new prompt can use that make a slot's contents worth parking
# rather than overwriting. One: a conversation's own part after a shared system prompt may
# be a short question, and a user who comes back wants all of it. What is parked in vain
# (a history the client rewrote, such as a reply whose reasoning it dropped) is evicted
# first, being used least recently.
PARK_MIN_TAIL = 1
# A shared prefix this long is kept as an anchor entry when a copy shows that two
# conversations share it.
ANCHOR_MIN = 256
# A request waits for another one still prefilling the same prefix only when that saves it
# this many tokens at least: a few tokens are decoded sooner than waited for.
FOLLOW_MIN = 64
# Decode steps a parked entry stays in the KV cache unused before it moves to host memory
# (`idle_to_spill`): on the demo model a kept cell costs about 0.4 µs a step and a restore
# a few µs a cell, so a conversation idle for some ten steps has cost what its restore
# would. Measured against llama-server, one stream (bench/throughput.py --pairs 1, runs of
# 30-40 paired rounds, 2026-11-27): after 64 steps 1.002x, 0.988x, 1.031x; after 16 steps
# (checked every 8) 0.981x, 0.977x. 64 keeps a returning client's conversation in place
# for about a second of one stream.
SPILL_AFTER = 64


@dataclass(frozen=True)
class Start(Generic[R]):
    """How a slot's sequence becomes ready for a prompt.

    `park`: first move the slot's present contents into an entry of their own (the slot gets
    an empty sequence). Then `source` None: keep the first `n` tokens of what the slot held
    (copied back from the parked entry when `park`); `take`: the slot swaps sequences with
    parked entry `source`, then keeps `n` tokens of it; otherwise copy the first `n` cells of
    `source` (a slot or an entry) into the slot's sequence. `anchor`: also keep those `n`
    cells as an anchor entry."""

    source: Slot[R] | None
    n: int
    take: bool = False
    park: bool = False
    anchor: bool = False


def _tail(cache: Sequence[int], prompt: Sequence[int]) -> int:
    """How many of a sequence's cached tokens `prompt` cannot use."""
    return len(cache) - common_prefix(cache, prompt)


def plan_start(
    slot: Slot[R],
    others: Sequence[Slot[R]],
    parked: Sequence[Slot[R]],
    prompt: Sequence[int],
    usable: Usable[R] = all_usable,
    anchors_allowed: bool = True,
) -> Start[R]:
    """The best way to start `prompt` in `slot`: the longest prefix any sequence can give
    (the slot's own on a tie, then a parked entry's, then another slot's), keeping what the
    slot held when the prompt cannot use it."""

    def reuse(s: Slot[R]) -> int:
        return usable(s, reusable_prefix(s.cache, prompt))

    own = reuse(slot)
    best: Slot[R] | None = None
    best_n = own
    for s in (*parked, *others):
        if s is slot:
            continue
        n = reuse(s)
        if n > best_n:
            best, best_n = s, n
    park = bool(slot.cache) and _tail(slot.cache, prompt) >= PARK_MIN_TAIL
    if best is None:
        return Start(None, own, park=park)
    if best in parked and not best.anchor and _tail(best.cache, prompt) < PARK_MIN_TAIL:
        # The entry holds little beyond what the prompt uses: the slot takes its sequence
        # whole, and what the slot held becomes the entry, or nothing. An anchor is only
        # ever copied from: it is kept for the next conversation that shares it.
        return Start(best, best_n, take=True, park=park)
    anchor = (
        anchors_allowed
        and best_n >= ANCHOR_MIN
        and _tail(best.cache, prompt) >= PARK_MIN_TAIL  # another conversation shares it
        and not any(_holds_prefix(e, prompt, best_n) for e in parked)
    )
    return Start(best, best_n, park=park, anchor=anchor)


def _holds_prefix(entry: Slot[R], prompt: Sequence[int], n: int) -> bool:
    """Whether `entry` is a prefix of `prompt` that ends at most FOLLOW_MIN tokens before
    `n`: an anchor for that shared prefix exists already."""
    m = len(entry.cache)
    return n - FOLLOW_MIN <= m <= n and common_prefix(entry.cache, prompt) == m


def wants_anchor(parked: Sequence[Slot[R]], prompt: Sequence[int], n: int) -> bool:
    """Whether copying `n` tokens of `prompt` from another request's sequence should leave
    an anchor entry for them too (none holds them yet)."""
    return n >= ANCHOR_MIN and not any(_holds_prefix(e, prompt, n) for e in parked)


@dataclass(frozen=True)
class Prefilling(Generic[R]):
    """A running request that has not finished its prompt: its slot, its prompt tokens."""

    slot: Slot[R]
    tokens: Sequence[int]


def follow_target(prompt: Sequence[int], start: int, running: Sequence[Prefilling[R]]) -> tuple[Slot[R], int] | None:
    """A request still prefilling a longer shared prefix than the `start` tokens the new
    prompt found cached: wait for it to decode those cells, then copy them. Returns its slot
    and the prefix length, or None when no such request saves FOLLOW_MIN tokens or more."""
    best: tuple[Slot[R], int] | None = None
    for p in running:
        n = min(common_prefix(p.tokens, prompt), len(prompt) - 1)
        if len(p.slot.cache) >= n:
            continue  # it holds them already: plan_start would have copied them
        if n - start >= FOLLOW_MIN and (best is None or n > best[1]):
            best = (p.slot, n)
    return best


def idle_to_spill(parked: Sequence[Slot[R]], others: Sequence[Slot[R]], after: int = SPILL_AFTER) -> Slot[R] | None:
    """The parked entry to move out of the KV cache into host memory now, if any: the one
    idle longest of those no prompt used for `after` decode steps.

    Every decode step's attention spans the KV cache up to its highest occupied cell, masked
    or not, so each parked cell costs every step of every stream (about 3% of one stream's
    speed for 8 kept conversations of the demo model, bench/results/throughput-pairs-*). A
    restore from host memory costs a few steps' worth of one cell each, once. Kept out of
    this: anchors, and an entry that shares ANCHOR_MIN tokens or more with another sequence
    (its shared cells would not be freed, and its restore would write them again as a copy
    of its own, losing the sharing that agent-like load is served by)."""
    idle = [e for e in parked if not e.anchor and e.idle_steps >= after and e.cache]
    for entry in sorted(idle, key=lambda e: -e.idle_steps):
        head = entry.cache[:ANCHOR_MIN]  # sharing ANCHOR_MIN tokens is sharing these: no more compared
        if len(head) < ANCHOR_MIN or not any(s is not entry and s.cache[:ANCHOR_MIN] == head for s in (*parked, *others)):
            return entry
    return None


def eviction_order(parked: Sequence[Slot[R]]) -> list[Slot[R]]:
    """Parked entries, the first to give up first: least recently used, an anchor counted as
    used one round of entries later than it was, so that a shared prefix outlives the
    conversations that share it."""
    bonus = len(parked) + 1
    return sorted(parked, key=lambda e: e.last_used + (bonus if e.anchor else 0))


__all__ = [
    "ANCHOR_MIN", "FOLLOW_MIN", "PARK_MIN_TAIL", "Prefilling", "SPILL_AFTER", "Start", "all_usable", "eviction_order",
    "follow_target", "idle_to_spill", "plan_start", "wants_anchor",
]
