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


def followers_to_detach(leader_slot_held: bool, leader_sampled: bool) -> bool:
    """A joined sibling whose leader lost its slot (preempted, finished, failed) before its
    prompt completed, or has sampled already, will never get shared logits: it must prefill
    the prompt itself."""
    return not leader_slot_held or leader_sampled
