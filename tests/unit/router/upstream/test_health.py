"""router/upstream/health.py: a replica leaves rotation after FALL failures in a row and
returns after RISE successes in a row."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router.upstream.health import FALL, RISE, Health


def run(results: list[bool], start: Health = Health()) -> Health:
    h = start
    for ok in results:
        h = h.observe(ok, None if ok else "connection refused")
    return h


def test_one_failure_does_not_take_a_replica_out() -> None:
    assert run([False] * (FALL - 1)).healthy
    h = run([False] * FALL)
    assert not h.healthy and h.last_error == "connection refused"


def test_a_success_between_failures_starts_the_count_again() -> None:
    assert run([False] * (FALL - 1) + [True] + [False] * (FALL - 1)).healthy


def test_a_replica_comes_back_after_rise_successes_in_a_row() -> None:
    down = run([False] * FALL)
    assert not run([True] * (RISE - 1), down).healthy
    assert not run([True] * (RISE - 1) + [False] + [True] * (RISE - 1), down).healthy
    up = run([True] * RISE, down)
    assert up.healthy and up.last_error is None


@given(st.lists(st.booleans(), max_size=40))
def test_the_state_follows_the_last_runs(results: list[bool]) -> None:
    h = run(results)
    # Healthy at the end exactly when the last FALL results were not all failures, and
    # either it never went down or it has since had RISE successes in a row.
    healthy = True
    fails = oks = 0
    for ok in results:
        fails, oks = (0, oks + 1) if ok else (fails + 1, 0)
        if healthy and fails >= FALL:
            healthy = False
        elif not healthy and oks >= RISE:
            healthy = True
    assert h.healthy == healthy
