"""The worker's priority rules (worker/priority.py), as pure functions, over random lines
and slots."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.priority import Running, insert_at, to_make_way, victim

ranks = st.integers(0, 3)
runnings = st.lists(
    st.one_of(st.none(), st.builds(Running, ranks, st.floats(0, 100, allow_nan=False), st.booleans())), min_size=1, max_size=6
)


@settings(max_examples=200, deadline=None)
@given(st.lists(ranks, max_size=12), ranks, st.booleans())
def test_the_line_stays_by_rank_and_then_by_arrival(line: list[int], rank: int, front: bool) -> None:
    line = sorted(line)
    at = insert_at(line, rank, front)
    new = line[:at] + [rank] + line[at:]
    assert new == sorted(new)
    same = [i for i, r in enumerate(new) if r == rank]
    # A newcomer goes behind its class; a request back from a slot, ahead of it.
    assert at == (same[0] if front else same[-1])


def test_the_worst_class_newest_is_parked_and_never_an_equal_or_unparkable_one() -> None:
    running = [Running(2, 1.0, True), Running(2, 5.0, True), Running(1, 9.0, True), Running(2, 7.0, False)]
    assert victim(running, 0) == 1
    assert victim(running, 1) == 1
    assert victim(running, 2) is None
    assert victim([None, Running(1, 0.0, True)], 0) == 1


@settings(max_examples=300, deadline=None)
@given(st.lists(ranks, max_size=8).map(sorted), runnings)
def test_making_way_parks_only_worse_parkable_ones_each_for_one_waiting(
    waiting: list[int], running: list[Running | None]
) -> None:
    out = to_make_way(waiting, running)
    assert len(out) == len(set(out))  # a slot once
    idle = sum(r is None for r in running)
    assert len(out) <= max(0, len(waiting) - idle)
    # Each parked one is worse than the waiting request it makes way for, in line order.
    served = waiting[idle:]
    for slot, rank in zip(out, served):
        r = running[slot]
        assert r is not None and r.parkable and r.rank > rank
    # No running request worse than the next unserved waiting one is left parkable when
    # that one stopped for want of a victim.
    if len(out) < len(served):
        stuck = served[len(out)]
        left = [r for i, r in enumerate(running) if i not in out and r is not None]
        assert not any(r.parkable and r.rank > stuck for r in left)


def test_with_one_class_nothing_is_ever_parked() -> None:
    running: list[Running | None] = [Running(1, float(i), True) for i in range(4)]
    assert to_make_way([1, 1, 1], running) == []


def test_a_step_carrying_a_classs_prompt_carries_no_worse_class() -> None:
    from worker.priority import worst_in_step

    assert worst_in_step([(2, False), (2, False), (0, True)]) == 0
    assert worst_in_step([(0, False), (1, True), (2, False)]) == 1  # the better decode goes along
    assert worst_in_step([(2, True), (0, False)]) == 2  # a batch prompt keeps nobody out
    assert worst_in_step([(1, False), (2, False)]) is None
