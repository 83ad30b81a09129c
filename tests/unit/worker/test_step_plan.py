"""The batch plan and the make-room policy, without a model (issue 9)."""

from __future__ import annotations

from dataclasses import dataclass

from worker.slots import Slot
from worker.step_plan import Halve, Preempt, Purge, make_room, plan_batch


@dataclass
class Req:
    name: str
    tokens: int  # prompt and output so far


def _pending(slot: Slot[Req]) -> int:
    assert slot.request is not None
    return slot.request.tokens - len(slot.cache)


def slot(seq_id: int, req: Req | None = None, cached: int = 0, last_used: int = 0) -> Slot[Req]:
    return Slot(seq_id=seq_id, cache=list(range(cached)), request=req, last_used=last_used)


def shares(plan: list) -> list[tuple[str, int, bool]]:  # type: ignore[type-arg]
    return [(c.slot.request.name, c.n, c.complete) for c in plan]


# ---- plan_batch ---------------------------------------------------------------------------------


def test_streams_go_first_then_prompts_in_admission_order() -> None:
    slots = [
        slot(0, Req("prompt-late", 100), last_used=5),
        slot(1, Req("stream-b", 41), cached=40, last_used=4),
        slot(2, Req("prompt-early", 30), last_used=2),
        slot(3, Req("stream-a", 11), cached=10, last_used=3),
    ]
    plan = plan_batch(slots, _pending, budget=512)
    assert shares(plan) == [
        ("stream-a", 1, True),
        ("stream-b", 1, True),
        ("prompt-early", 30, True),
        ("prompt-late", 100, True),
    ]


def test_a_prompt_that_does_not_fit_takes_what_room_is_left() -> None:
    slots = [slot(0, Req("stream", 6), cached=5, last_used=1), slot(1, Req("prompt", 1000), cached=200, last_used=2)]
    assert shares(plan_batch(slots, _pending, budget=64)) == [("stream", 1, True), ("prompt", 63, False)]
    # the next step goes on where the cache ends
    slots[1].cache.extend(range(63))
    slots[0].cache.append(0)
    slots[0].request.tokens += 1  # type: ignore[union-attr]
    assert shares(plan_batch(slots, _pending, budget=64)) == [("stream", 1, True), ("prompt", 63, False)]


def test_a_full_batch_leaves_the_rest_for_the_next_step() -> None:
    slots = [slot(i, Req(f"p{i}", 40), last_used=i) for i in range(4)]
    assert shares(plan_batch(slots, _pending, budget=64)) == [("p0", 40, True), ("p1", 24, False)]
    # streams are never crowded out by prompts: they come first
    slots.append(slot(4, Req("s", 3), cached=2, last_used=9))
    assert shares(plan_batch(slots, _pending, budget=2)) == [("s", 1, True), ("p0", 1, False)]


def test_idle_slots_take_no_share() -> None:
    slots = [slot(0, cached=50), slot(1, Req("only", 8), last_used=1), slot(2)]
    assert shares(plan_batch(slots, _pending, budget=512)) == [("only", 8, True)]
    assert plan_batch([slot(0), slot(1)], _pending, budget=512) == []


# ---- make_room ----------------------------------------------------------------------------------


def test_idle_caches_are_purged_first() -> None:
    idle_cached, idle_empty = slot(0, cached=30), slot(1)
    running = [slot(2, Req("a", 10), cached=5, last_used=1), slot(3, Req("b", 10), cached=5, last_used=2)]
    remedy = make_room([idle_cached, idle_empty, *running], batch_tokens=60)
    assert remedy == Purge((idle_cached,))


def test_then_a_smaller_batch_while_prompt_chunks_are_in_it() -> None:
    running = [slot(0, Req("a", 10), cached=9, last_used=1), slot(1, Req("b", 500), last_used=2)]
    assert make_room([*running, slot(2)], batch_tokens=257) == Halve()
    assert make_room(running, batch_tokens=3) == Halve()


def test_then_the_newest_request_is_preempted() -> None:
    old, new, mid = (
        slot(0, Req("old", 10), cached=9, last_used=1),
        slot(1, Req("new", 10), cached=9, last_used=7),
        slot(2, Req("mid", 10), cached=9, last_used=4),
    )
    assert make_room([old, new, mid], batch_tokens=3) == Preempt(new)


def test_nothing_is_left_when_one_request_fills_the_pool() -> None:
    assert make_room([slot(0, Req("alone", 4096), cached=4095, last_used=1), slot(1)], batch_tokens=1) is None


def test_the_order_over_successive_failures_is_purge_halve_preempt() -> None:
    """What the engine sees when llama_decode keeps answering 1, performing each remedy."""
    slots = [
        slot(0, cached=100),
        slot(1, Req("stream", 51), cached=50, last_used=1),
        slot(2, Req("prompt", 400), last_used=2),
    ]
    budget, seen = 512, []
    while True:
        plan = plan_batch(slots, _pending, budget)
        remedy = make_room(slots, sum(c.n for c in plan))
        seen.append(type(remedy).__name__)
        if isinstance(remedy, Purge):
            for s in remedy.slots:
                s.cache.clear()
        elif isinstance(remedy, Halve):
            budget //= 2
        else:
            break
    assert seen == ["Purge"] + ["Halve"] * 8 + ["Preempt"]  # 512 -> 2: one stream token, one prompt token
    assert remedy == Preempt(slots[2])  # the prompt: admitted last
    assert budget == 2
