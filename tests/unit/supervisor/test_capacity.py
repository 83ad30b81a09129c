"""The capacity decision (supervisor/capacity.py) and the core division (supervisor/cores.py)."""

from __future__ import annotations

import pytest

from supervisor.capacity import Admit, Evict, Limits, Resident, Wait, format_size, parse_size, plan
from supervisor.cores import divide_cores

GiB = 1024**3


def r(name: str, cost: int = GiB, last_used: float = 0.0, evictable: bool = True, leaving: bool = False) -> Resident:
    return Resident(name, cost, last_used, evictable, leaving)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0), (1234, 1234), ("1234", 1234), ("12GiB", 12 * GiB), ("12 gib", 12 * GiB),
        ("1.5GiB", int(1.5 * GiB)), ("500MB", 500_000_000), ("8G", 8_000_000_000),
        ("512MiB", 512 * 1024**2), ("2KiB", 2048), ("1TB", 10**12), ("3b", 3),
    ],
)
def test_parse_size(text: int | str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "12 parsecs", "-1GiB", "1,5GiB", "12GiB extra", -5])
def test_parse_size_rejects_what_is_not_a_size(bad: int | str) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


def test_format_size() -> None:
    assert format_size(12 * GiB) == "12.0GiB"
    assert format_size(1536 * 1024) == "1.5MiB"
    assert format_size(10) == "10B"


def test_no_limits_always_admits() -> None:
    assert plan("x", 100 * GiB, [r("a"), r("b")], Limits()) == Admit()
    assert Limits().unlimited and not Limits(max_models=1).unlimited


def test_admits_when_it_fits_both_limits() -> None:
    limits = Limits(max_models=3, budget=4 * GiB)
    assert plan("x", GiB, [r("a"), r("b")], limits) == Admit()


def test_count_limit_evicts_the_least_recently_used_idle_model() -> None:
    residents = [r("a", last_used=30), r("b", last_used=10), r("c", last_used=20)]
    assert plan("x", GiB, residents, Limits(max_models=3)) == Evict(("b",))


def test_busy_and_pinned_models_are_skipped_even_when_least_recent() -> None:
    residents = [r("busy", last_used=1, evictable=False), r("idle", last_used=50)]
    assert plan("x", GiB, residents, Limits(max_models=2)) == Evict(("idle",))


def test_memory_budget_evicts_as_few_as_needed_in_lru_order() -> None:
    residents = [r("a", GiB, 1), r("b", GiB, 2), r("c", 2 * GiB, 3)]
    limits = Limits(budget=5 * GiB)
    # 4 GiB used; 2 more need 1 GiB freed: only a.
    assert plan("x", 2 * GiB, residents, limits) == Evict(("a",))
    # 3 more need 2 GiB freed: a, then b.
    assert plan("x", 3 * GiB, residents, limits) == Evict(("a", "b"))


def test_nothing_is_evicted_when_evicting_everything_possible_would_not_be_enough() -> None:
    residents = [r("idle", GiB, 1), r("busy", 3 * GiB, 0, evictable=False)]
    decision = plan("x", 2 * GiB, residents, Limits(budget=4 * GiB))
    assert isinstance(decision, Wait)
    assert "'x'" in decision.reason and "busy or pinned" in decision.reason
    assert "memory_budget = 4.0GiB" in decision.reason


def test_models_already_leaving_are_waited_for_not_evicted_again() -> None:
    residents = [r("going", GiB, 1, evictable=False, leaving=True), r("idle", GiB, 2)]
    decision = plan("x", GiB, residents, Limits(max_models=2))
    assert decision == Wait("waiting for going to stop")


def test_a_model_larger_than_the_budget_runs_alone() -> None:
    assert plan("huge", 10 * GiB, [], Limits(budget=4 * GiB)) == Admit()
    assert plan("huge", 10 * GiB, [r("a", GiB, 1)], Limits(budget=4 * GiB)) == Evict(("a",))


def test_count_limit_reason_names_the_limit() -> None:
    decision = plan("x", 1, [r("a", evictable=False)], Limits(max_models=1))
    assert isinstance(decision, Wait) and "max_loaded_models = 1" in decision.reason


@pytest.mark.parametrize(
    ("cores", "workers", "expected"),
    [
        (8, {"a": None}, {"a": 8}),
        (8, {"a": None, "b": None}, {"a": 4, "b": 4}),
        (8, {"a": None, "b": None, "c": None}, {"a": 3, "b": 3, "c": 2}),
        (8, {"a": None, "fixed": 2}, {"a": 6}),
        (2, {"a": None, "b": None, "c": None}, {"a": 1, "b": 1, "c": 1}),  # never below 1
        (4, {"a": None, "fixed": 6}, {"a": 1}),
        (4, {"fixed": 2}, {}),
        (4, {}, {}),
    ],
)
def test_divide_cores(cores: int, workers: dict[str, int | None], expected: dict[str, int]) -> None:
    assert divide_cores(cores, workers) == expected


def test_divided_threads_never_exceed_the_cores_when_there_are_enough() -> None:
    for cores in range(1, 17):
        for n in range(1, cores + 1):
            shares = divide_cores(cores, {f"m{i}": None for i in range(n)})
            assert sum(shares.values()) == cores
            assert max(shares.values()) - min(shares.values()) <= 1
