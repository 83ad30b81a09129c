"""The slot pool: which slot a request gets, and how much of its cache it can keep.

Pure logic over plain data, no ctypes: the engine asks, then performs the KV operations.
A slot is one llama.cpp sequence id. Its `cache` lists the tokens at positions 0 .. n-1 of
that sequence, which the KV cache holds too (worker/kv_cache.py keeps the two in step and
checks them every step). Which prefix of them can be kept for a new prompt is a list
comparison, then a question to the KV cache: a sliding-window model may no longer hold the
cells a shorter prefix needs (worker/kv_rules.py), so the caller says how many of a slot's
first n tokens are `usable`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generic, Sequence, TypeVar

R = TypeVar("R")


@dataclass
class Slot(Generic[R]):
    # The llama.cpp sequence it holds now. A slot may swap sequences with a parked entry
    # (worker/prefix_reuse.py) while idle, so this is not its public number.
    seq_id: int
    cache: list[int] = field(default_factory=list)
    request: R | None = None
    last_used: int = 0  # a logical clock, bumped when a request is assigned or an entry used
    id: int = -1  # the slot's number (GET /slots, id_slot); -1: a parked entry, no slot
    anchor: bool = False  # a parked entry kept for a prefix that conversations share
    idle_steps: int = 0  # a parked entry: decode steps since a prompt last used its cells
    # The cache scope its cells belong to (Generate.cache_scope): only a request of the same
    # scope may reuse them. Set with the cells (admission, copies, restores).
    scope: str = ""

    @property
    def idle(self) -> bool:
        return self.request is None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share. Admission asks this of every sequence for
    every prompt, and prompts run to tens of thousands of tokens: slices compare in C, so
    a run of equal chunks costs little, and only the chunk with the first difference is
    walked in Python."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    i, step = 0, 256
    while i + step <= n and list(a[i : i + step]) == list(b[i : i + step]):
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


# How many of a slot's first n cached tokens its KV cells can still give (KvCache.usable).
Usable = Callable[[Slot[R], int], int]


def all_usable(slot: Slot[R], n: int) -> int:
    """For models whose every cached token stays usable, and for tests of the choice alone."""
    return n


def scoped(usable: Usable[R], scope: str) -> Usable[R]:
    """`usable` for a request of cache scope `scope`: another scope's cells give it nothing."""

    def usable_in_scope(slot: Slot[R], n: int) -> int:
        return usable(slot, n) if slot.scope == scope else 0

    return usable_in_scope


def choose_slot(
    slots: Sequence[Slot[R]], prompt: Sequence[int], usable: Usable[R] = all_usable
) -> Slot[R] | None:
    """The idle slot whose cache has the longest prefix `prompt` can keep (`usable` says how
    much of a matching prefix the KV cache still holds), else the least recently used idle
    slot (its cache is the least likely to be wanted again). None when every slot is busy."""
    best: Slot[R] | None = None
    best_key: tuple[int, int] = (-1, 0)
    for slot in slots:
        if not slot.idle:
            continue
        # Longer usable prefix first; among equals, the older slot.
        key = (usable(slot, reusable_prefix(slot.cache, prompt)), -slot.last_used)
        if best is None or key > best_key:
            best, best_key = slot, key
    return best


def reusable_prefix(cache: Sequence[int], prompt: Sequence[int]) -> int:
    """How many cached tokens a new prompt can keep.

    At least one prompt token must be decoded again, because sampling needs the logits of
    the prompt's last position and the cache keeps no logits.
    """
    keep = common_prefix(cache, prompt)
    if keep >= len(prompt):
        keep = len(prompt) - 1
    return max(keep, 0)
