"""How the second and later choices of an n > 1 request start: pure decisions over the slot
pool (worker/slots.py), which the engine performs.

A request with n choices is split into n sibling requests that share the prompt. Choice 0
(the leader) is admitted and prefills the prompt as any request does. A sibling then starts
in one of three ways, best first:

- `Join`: the leader holds a slot and has not sampled yet. The sibling takes a slot but
  decodes nothing; when the leader's prompt completes, the sibling samples its first token
  from the same logits (its own chain and seed) and takes the prompt's KV cells with
  `llama_memory_seq_cp`. The KV cache is unified, so a copy only tags cells: the prompt is
  evaluated once, whatever n is.
- `CopyPrefix`: the leader has moved on (the sibling waited for a slot), but some slot's
  cache still begins with the prompt: copy those cells, then decode only what is left (at
  least the last prompt token, whose logits the sibling samples from).
- `None`: prefill as a plain request (its own slot's cached prefix is still reused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Sequence, TypeVar, Union

from worker.slots import Slot, Usable, all_usable, common_prefix, reusable_prefix

R = TypeVar("R")


@dataclass(frozen=True)
class Join:
    """Sample the first token from the leader's prompt logits, in the step that completes
    its prompt."""


@dataclass(frozen=True)
class CopyPrefix(Generic[R]):
    """Copy the first `n` cells of `source`'s sequence into the sibling's, then prefill."""

    source: Slot[R]
    n: int


SiblingStart = Union[Join, CopyPrefix[R], None]


def sibling_start(
    leader_prefilling: bool,
    slots: Sequence[Slot[R]],
    chosen: Slot[R],
    prompt: Sequence[int],
    usable: Usable[R] = all_usable,
) -> SiblingStart[R]:
    """How a sibling admitted into `chosen` starts. `leader_prefilling`: its leader holds a
    slot and has not sampled its first token (so its prompt logits are still to come).
    `usable(slot, n)`: how many of a slot's first n cached tokens its KV cells can still
    give (a sliding-window model may have given away the cells a shorter prefix needs:
    worker/kv_rules.py)."""
    if leader_prefilling:
        return Join()
    own = usable(chosen, reusable_prefix(chosen.cache, prompt))
    best: Slot[R] | None = None
    best_n = own
    for s in slots:
        if s is chosen:
            continue
        # Back off one token, as reusable_prefix does: the last prompt position must be
        # decoded again for its logits.
        n = usable(s, min(common_prefix(s.cache, prompt), len(prompt) - 1))
        if n > best_n:
            best, best_n = s, n
    return CopyPrefix(best, best_n) if best is not None else None


def followers_to_detach(leader_slot_held: bool, leader_sampled: bool) -> bool:
    """A joined sibling whose leader lost its slot (preempted, finished, failed) before its
    prompt completed, or has sampled already, will never get shared logits: it must prefill
    the prompt itself."""
    return not leader_slot_held or leader_sampled
