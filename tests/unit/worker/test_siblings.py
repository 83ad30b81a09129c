"""worker/siblings.py and the step plan's view of siblings: how the second and later
choices of an n > 1 request start (issue 10, item 4). A late sibling starts as any request
does: tests/unit/worker/test_prefix_reuse.py."""

from __future__ import annotations

from dataclasses import dataclass

from worker.siblings import followers_by_lead, followers_to_detach
from worker.slots import Slot
from worker.step_plan import Halve, Preempt, make_room, plan_batch

@dataclass
class Req:
    name: str
    tokens: int
    follows: bool = False


def slot(seq_id: int, cache: list[int] | None = None, req: Req | None = None, last_used: int = 0) -> Slot[Req]:
    return Slot(seq_id=seq_id, cache=list(cache or []), request=req, last_used=last_used)


def test_a_follower_detaches_once_its_leader_cannot_share_its_logits() -> None:
    assert not followers_to_detach(leader_slot_held=True, leader_sampled=False)
    assert followers_to_detach(leader_slot_held=False, leader_sampled=False)  # preempted, gone
    assert followers_to_detach(leader_slot_held=True, leader_sampled=True)


def pending(s: Slot[Req]) -> int:
    assert s.request is not None
    return 0 if s.request.follows else s.request.tokens - len(s.cache)


def test_the_batch_leaves_out_siblings_that_wait_to_share_a_prompt() -> None:
    slots = [slot(0, req=Req("leader", 6), last_used=1), slot(1, req=Req("sib", 6, follows=True), last_used=2)]
    plan = plan_batch(slots, pending, budget=512)
    assert [(c.slot.request.name, c.n, c.complete) for c in plan] == [("leader", 6, True)]  # type: ignore[union-attr]


def test_a_waiting_sibling_is_never_preempted_nor_counted() -> None:
    def waits(s: Slot[Req]) -> bool:
        return s.request is not None and s.request.follows

    stream = slot(0, [0] * 10, Req("stream", 11), last_used=1)
    leader = slot(1, [], Req("leader", 1), last_used=2)
    sib = slot(2, [], Req("sib", 1, follows=True), last_used=3)
    # Two tokens for two running requests: halving cannot help; the newest that holds a
    # place in the batch goes, not the sibling admitted after it.
    assert make_room([stream, leader, sib], batch_tokens=2, waits=waits) == Preempt(leader)
    # Without the sibling counted, three tokens for two requests is a batch to halve.
    assert make_room([stream, leader, sib], batch_tokens=3, waits=waits) == Halve()
    assert make_room([leader, sib], batch_tokens=1, waits=waits) is None


def test_followers_are_grouped_by_their_leader_in_slot_order() -> None:
    @dataclass
    class R:
        name: str
        follows: "R | None" = None

    lead_a, lead_b = R("a"), R("b")
    f1, f2, f3 = R("f1", lead_a), R("f2", lead_b), R("f3", lead_a)
    joined = followers_by_lead([lead_a, f1, lead_b, f2, f3], lambda r: r.follows)
    assert joined == {id(lead_a): [f1, f3], id(lead_b): [f2]}
    assert followers_by_lead([lead_a, lead_b], lambda r: r.follows) == {}
