"""The slot pool: which slot a request gets, and how much of its cache it can keep.

Pure logic over plain data, no ctypes: the engine asks, then performs the KV operations.
A slot is one llama.cpp sequence id. Its `cache` mirrors exactly the tokens that the KV cache
holds for that sequence, so prefix reuse is a list comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Sequence, TypeVar

R = TypeVar("R")


@dataclass
class Slot(Generic[R]):
    seq_id: int
    cache: list[int] = field(default_factory=list)
    request: R | None = None
    last_used: int = 0  # a logical clock, bumped when a request is assigned

    @property
    def idle(self) -> bool:
        return self.request is None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def choose_slot(slots: Sequence[Slot[R]], prompt: Sequence[int]) -> Slot[R] | None:
    """The idle slot whose cache shares the longest prefix with `prompt`, else the least
    recently used idle slot (its cache is the least likely to be wanted again). None when
    every slot is busy."""
    best: Slot[R] | None = None
    best_key: tuple[int, int] = (-1, 0)
    for slot in slots:
        if not slot.idle:
            continue
        # Longer shared prefix first; among equals, the older slot.
        key = (common_prefix(slot.cache, prompt), -slot.last_used)
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
