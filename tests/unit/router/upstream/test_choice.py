"""router/upstream/choice.py: replica choice with affinity under a bound on load."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from router.upstream.choice import SLACK, Replica, pick, rank

NAMES = [f"http://10.0.0.{i}:8080/v1" for i in range(1, 6)]

replicas = st.lists(
    st.builds(
        Replica,
        name=st.sampled_from(NAMES),
        in_flight=st.integers(0, 20),
        healthy=st.booleans(),
        limit=st.none() | st.integers(1, 20),
        local=st.booleans(),
        line_full=st.booleans(),
    ),
    min_size=1,
    max_size=5,
    unique_by=lambda r: r.name,
)


@given(replicas, st.text(max_size=8), st.frozensets(st.sampled_from(NAMES)))
def test_a_pick_is_able_to_serve_and_none_only_when_no_replica_is(rs: list[Replica], key: str, tried: frozenset[str]) -> None:
    able = [r for r in rs if r.healthy and r.name not in tried and r.has_room()]
    got = pick(rs, key, tried)
    if not able:
        assert got is None
        return
    assert got in able
    # Spill-over: a full local line is passed over while another replica can serve.
    if got.local and got.line_full:
        assert all(r.local and r.line_full for r in able)
    pool = [r for r in able if not (r.local and r.line_full)] or able
    # The bound on load: never more than SLACK times the average, this request counted.
    assert got.in_flight + 1 <= math.ceil(SLACK * (sum(r.in_flight for r in pool) + 1) / len(pool))


@given(st.text(max_size=12), st.integers(2, 5))
def test_a_conversation_returns_to_its_replica_while_loads_are_even(key: str, n: int) -> None:
    rs = [Replica(name) for name in NAMES[:n]]
    first = pick(rs, key)
    assert first is not None
    assert all(pick(rs, key) == first for _ in range(3))
    assert first.name == rank(key, NAMES[:n])[0]


@given(st.text(max_size=12))
def test_losing_another_replica_moves_no_conversation(key: str) -> None:
    rs = [Replica(name) for name in NAMES]
    home = pick(rs, key)
    assert home is not None
    for gone in NAMES:
        if gone != home.name:
            assert pick([r for r in rs if r.name != gone], key) == home


def test_a_busy_home_sends_its_conversation_to_the_next_replica_in_its_own_order() -> None:
    key = "session-42"
    order = rank(key, NAMES[:3])
    rs = [Replica(n, in_flight=6 if n == order[0] else 0) for n in NAMES[:3]]
    # Average with this request: 7 / 3; bound ceil(1.25 * 7 / 3) = 3, and the home has 6.
    got = pick(rs, key)
    assert got is not None and got.name == order[1]
    # Load evened out again: the conversation goes home.
    assert pick([Replica(n, in_flight=2) for n in NAMES[:3]], key) == Replica(order[0], in_flight=2)


def test_failover_tries_each_replica_once_then_gives_up() -> None:
    rs = [Replica(n) for n in NAMES[:3]]
    tried: frozenset[str] = frozenset()
    seen = []
    while (r := pick(rs, "k", tried)) is not None:
        seen.append(r.name)
        tried |= {r.name}
    assert sorted(seen) == sorted(NAMES[:3])


def test_the_local_worker_spills_over_only_while_its_line_is_full() -> None:
    local = Replica("local", local=True)
    remote = Replica(NAMES[0])
    keys = [f"k{i}" for i in range(200)]
    assert {pick([local, remote], k).name for k in keys} == {"local", NAMES[0]}  # type: ignore[union-attr]
    full = Replica("local", local=True, line_full=True)
    assert {pick([full, remote], k).name for k in keys} == {NAMES[0]}  # type: ignore[union-attr]
    # No remote can take it: the local line queues it.
    assert pick([full, Replica(NAMES[0], healthy=False)], "k") == full


def test_requests_without_a_session_spread_evenly() -> None:
    rs = [Replica(n) for n in NAMES[:4]]
    counts = Counter(pick(rs, f"request-{i}").name for i in range(4000))  # type: ignore[union-attr]
    assert set(counts) == set(NAMES[:4])
    assert max(counts.values()) < 1.15 * min(counts.values())


def test_a_replica_at_its_limit_takes_nothing() -> None:
    assert pick([Replica(NAMES[0], in_flight=2, limit=2)], "k") is None
    assert pick([Replica(NAMES[0], in_flight=2, limit=2), Replica(NAMES[1], in_flight=9)], "k") == Replica(NAMES[1], in_flight=9)


def test_a_preferred_replica_comes_first_within_the_bound_and_not_beyond_it() -> None:
    """A local instance that served the conversation last holds its prefix (issue 43):
    it is chosen over the rendezvous order while its load is within the bound."""
    key = "conversation"
    order = rank(key, NAMES[:2])
    rs = [Replica(n) for n in NAMES[:2]]
    assert pick(rs, key, prefer=order[1]).name == order[1]  # type: ignore[union-attr]
    busy = [Replica(order[0]), Replica(order[1], in_flight=5)]
    assert pick(busy, key, prefer=order[1]).name == order[0]  # type: ignore[union-attr]
    # One that is tried, or gone, is no preference.
    assert pick(rs, key, frozenset({order[1]}), prefer=order[1]).name == order[0]  # type: ignore[union-attr]
    assert pick(rs, key, prefer="http://gone").name == order[0]  # type: ignore[union-attr]
