"""supervisor/lifecycle.py: the transition table and check()."""

from __future__ import annotations

import itertools

import pytest

from supervisor.lifecycle import TRANSITIONS, IllegalTransition, State, check


@pytest.mark.parametrize(
    ("old", "new"),
    sorted(TRANSITIONS, key=lambda t: (t[0].value, t[1].value)),
    ids=lambda s: s.value,
)
def test_every_edge_passes(old: State, new: State) -> None:
    check(old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (State.STOPPED, State.READY),
        (State.FAILED, State.READY),
        (State.READY, State.STARTING),
        (State.FAILED, State.STARTING),
        (State.STOPPED, State.STOPPING),
        (State.DRAINING, State.STARTING),
        (State.BACKOFF, State.READY),
    ],
    ids=lambda s: s.value,
)
def test_illegal_transitions_raise(old: State, new: State) -> None:
    with pytest.raises(IllegalTransition) as info:
        check(old, new)
    assert old.value in str(info.value) and new.value in str(info.value)


def test_self_transitions_are_illegal() -> None:
    for s in State:
        with pytest.raises(IllegalTransition):
            check(s, s)


def test_check_agrees_with_table_for_all_pairs() -> None:
    for old, new in itertools.product(State, State):
        if (old, new) in TRANSITIONS:
            check(old, new)
        else:
            with pytest.raises(IllegalTransition):
                check(old, new)


def test_every_state_appears_in_an_edge() -> None:
    used = {s for edge in TRANSITIONS for s in edge}
    assert used == set(State)


def test_every_state_is_entered_and_left() -> None:
    sources = {old for old, _ in TRANSITIONS}
    targets = {new for _, new in TRANSITIONS}
    assert sources == set(State)
    assert targets == set(State)


def test_every_state_reachable_from_stopped_and_back() -> None:
    def reach(start: State, edges: set[tuple[State, State]]) -> set[State]:
        seen, todo = {start}, [start]
        while todo:
            cur = todo.pop()
            for a, b in edges:
                if a is cur and b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    assert reach(State.STOPPED, set(TRANSITIONS)) == set(State)
    reverse = {(b, a) for a, b in TRANSITIONS}
    assert reach(State.STOPPED, reverse) == set(State)  # STOPPED is reachable from everywhere


def test_illegal_transition_is_runtime_error() -> None:
    assert issubclass(IllegalTransition, RuntimeError)
