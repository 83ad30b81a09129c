"""What one decode step holds, and what to free when the KV cache is full.

Pure decisions over the slot pool (worker/slots.py), no ctypes: the engine asks, then fills
the llama_batch or performs the KV operations. Kept apart so that the batching order and the
make-room policy can be tested without a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar, Union

from worker.slots import Slot

R = TypeVar("R")


@dataclass(frozen=True)
class Chunk(Generic[R]):
    """One running request's share of a step."""

    slot: Slot[R]
    n: int  # how many of its pending tokens go into this batch
    complete: bool  # all of them: it samples from this step's logits


def plan_batch(slots: Sequence[Slot[R]], pending: Callable[[Slot[R]], int], budget: int) -> list[Chunk[R]]:
    """The running requests' shares of a batch of at most `budget` tokens.

    Generating requests (one pending token) come first, so that a long prompt never holds
    back a stream; then prompts, in admission order, each taking what room is left. A prompt
    that does not fit completes over the next steps. `pending(slot)` is how many of its
    request's tokens its cache does not hold yet.
    """
    # A slot with nothing pending is an n > 1 sibling waiting to share another's logits.
    running = [s for s in slots if s.request is not None and pending(s) > 0]
    running.sort(key=lambda s: (pending(s) > 1, s.last_used))
    plan: list[Chunk[R]] = []
    used = 0
    for slot in running:
        room = budget - used
        if room <= 0:
            break
        todo = pending(slot)
        n = min(todo, room)
        plan.append(Chunk(slot, n, n == todo))
        used += n
    return plan


@dataclass(frozen=True)
class Purge(Generic[R]):
    """Drop these parked entries' or idle slots' caches: kept only for prefix reuse, they
    are free to take."""

    slots: tuple[Slot[R], ...]


@dataclass(frozen=True)
class Halve:
    """Retry with half the batch: prompt chunks need cells that a smaller batch does not."""


@dataclass(frozen=True)
class Preempt(Generic[R]):
    """Take this slot's cells back; its request waits at the head of the queue and is
    recomputed later, its output so far kept."""

    slot: Slot[R]


Remedy = Union[Purge[R], Halve, Preempt[R], None]


def _never(_: Slot[R]) -> bool:
    return False


def make_room(
    slots: Sequence[Slot[R]],
    batch_tokens: int,
    waits: Callable[[Slot[R]], bool] = _never,
    parked: Sequence[Slot[R]] = (),
) -> Remedy[R]:
    """What to free after llama_decode found no KV space (the cache is left unchanged), so
    that a retry can succeed. In order: parked entries, one at a time in the order given
    (worker/prefix_reuse.py, eviction_order: cells shared with other sequences free nothing,
    and the next retry says whether it was enough); idle slots' caches; a smaller batch, which helps only
    while prompt chunks are in it (more tokens than running requests); then the most recently
    admitted request, while another one runs (`waits(slot)`: a sibling that waits to
    share another's prompt, never a victim). None: nothing is left to try, and the one
    running request has reached the pool's limit."""
    if parked:
        return Purge((parked[0],))
    idle = tuple(s for s in slots if s.idle and s.cache)
    if idle:
        return Purge(idle)
    # An n > 1 sibling waiting to share its leader's prompt puts nothing in the batch and
    # holds no cells: it does not count, and preempting it would free nothing.
    running = [s for s in slots if not s.idle and not waits(s)]
    if batch_tokens > len(running):
        return Halve()
    if len(running) > 1:
        return Preempt(max(running, key=lambda s: s.last_used))
    return None
