"""How the second and later choices of an n > 1 request start.

A request with n choices is split into n sibling requests that share the prompt. Choice 0
(the leader) is admitted and prefills the prompt as any request does. A sibling admitted
while the leader holds a slot and has not sampled yet joins it: it takes a slot but decodes
nothing; when the leader's prompt completes, the sibling samples its first token from the
same logits (its own chain and seed) and takes the prompt's KV cells with
`llama_memory_seq_cp`. The KV cache is unified, so a copy only tags cells: the prompt is
evaluated once, whatever n is. A sibling admitted later starts as any request does
(worker/prefix_reuse.py): it copies the longest prefix any sequence still holds, the
leader's among them, and decodes at least the prompt's last token for its own logits.
"""

from __future__ import annotations

from typing import Callable, Iterable, TypeVar

R = TypeVar("R")


def followers_to_detach(leader_slot_held: bool, leader_sampled: bool) -> bool:
    """A joined sibling whose leader lost its slot (preempted, finished, failed) before its
    prompt completed, or has sampled already, will never get shared logits: it must prefill
    the prompt itself."""
    return not leader_slot_held or leader_sampled


def followers_by_lead(running: Iterable[R], lead_of: Callable[[R], R | None]) -> dict[int, list[R]]:
    """The joined siblings waiting on each leader, keyed by the leader's id(), in the order
    given; a leader nobody waits on has no key. One pass over the running requests, every
    step."""
    joined: dict[int, list[R]] = {}
    for r in running:
        lead = lead_of(r)
        if lead is not None:
            joined.setdefault(id(lead), []).append(r)
    return joined
