"""The adapter-set schedule (worker/adapter_turns.py): shares in proportion to requests,
no starvation, no bursts, and the set naming that keys the prefix cache."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.adapter_turns import BASE, Turns, adapter_set, scope_suffix

sets = st.sampled_from([BASE, ((0, 1.0),), ((1, 1.0),), ((0, 0.5),), ((0, 1.0), (1, 0.25))])
counts = st.dictionaries(sets, st.integers(1, 6), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(counts, st.integers(1, 200))
def test_each_set_gets_its_share_of_steps_to_within_one(load: dict, steps: int) -> None:
    turns = Turns()
    served = dict.fromkeys(load, 0)
    current = None
    total = sum(load.values())
    for t in range(1, steps + 1):
        current = turns.choose(load, current)
        served[current] += 1
        for s, n in load.items():
            # Smooth weighted round robin: never more than one step from the exact share.
            assert abs(served[s] - t * n / total) < 1 + 1e-9, (s, served, t)


@settings(max_examples=200, deadline=None)
@given(st.lists(counts, min_size=1, max_size=40))
def test_no_set_waits_longer_than_one_round_of_the_others(loads: list[dict]) -> None:
    """Whatever comes and goes, a set present for 2 * `total` steps in a row is served in
    them (credit carried from an earlier mix may cost it one round more)."""
    turns = Turns()
    waited: dict = {}
    current = None
    for load in loads:
        for _ in range(3):
            current = turns.choose(load, current)
            total = sum(load.values())
            for s in load:
                waited[s] = 0 if s == current else waited.get(s, 0) + 1
                assert waited[s] < 2 * total, (s, load, waited)
            waited = {s: w for s, w in waited.items() if s in load}


def test_even_split_alternates_and_a_tie_keeps_the_set_the_context_holds() -> None:
    turns = Turns()
    a, b = ((0, 1.0),), ((1, 1.0),)
    picks = []
    current = b
    for _ in range(6):
        current = turns.choose({a: 2, b: 2}, current)
        picks.append(current)
    # Each tie keeps the set the context holds: the same shares, half the graph rebuilds.
    assert picks == [b, a, a, b, b, a]
    # Three to one: a's turns are spread, never three of b's in a row.
    turns = Turns()
    picks = [turns.choose({a: 3, b: 1}) for _ in range(8)]
    assert picks.count(a) == 6 and picks.count(b) == 2
    assert picks[:4].count(b) == 1


def test_one_set_alone_is_always_chosen_and_forgets_old_credit() -> None:
    turns = Turns()
    a = ((0, 1.0),)
    for _ in range(5):
        assert turns.choose({a: 3}) == a
    assert turns.credit == {a: 0}


def test_a_set_drops_zero_scales_and_orders_by_index() -> None:
    assert adapter_set([(1, 0.5), (0, 0.0), (2, -0.0)]) == ((1, 0.5),)
    assert adapter_set([(1, 0.5), (0, 2.0)]) == ((0, 2.0), (1, 0.5))
    assert adapter_set([(0, 1.0), (0, 0.0)]) == BASE  # the later pair wins
    assert scope_suffix(BASE) == ""
    # Different scales of one adapter are different computations: different scopes.
    assert scope_suffix(((0, 0.5),)) != scope_suffix(((0, 1.0),)) != ""
