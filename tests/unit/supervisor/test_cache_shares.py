"""supervisor/cache_shares.py: prompt_cache_budget divided among the loaded models."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisor.cache_shares import divide_bytes


def test_no_budget_leaves_every_model_its_own_bound() -> None:
    assert divide_bytes(0, {"a": 10, "b": 20}) == {"a": 10, "b": 20}


def test_an_even_split_where_every_bound_is_larger() -> None:
    assert divide_bytes(90, {"a": 100, "b": 100, "c": 100}) == {"a": 30, "b": 30, "c": 30}


def test_a_small_bound_leaves_its_rest_to_the_others() -> None:
    assert divide_bytes(90, {"a": 10, "b": 100, "c": 100}) == {"a": 10, "b": 40, "c": 40}
    assert divide_bytes(1000, {"a": 10, "b": 100}) == {"a": 10, "b": 100}


@given(st.integers(1, 10**12), st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 10**12), max_size=8))
def test_shares_stay_within_the_budget_and_each_bound(budget: int, wants: dict[str, int]) -> None:
    shares = divide_bytes(budget, wants)
    assert set(shares) == set(wants)
    assert sum(shares.values()) <= budget
    assert all(0 <= shares[n] <= wants[n] for n in wants)
    # Nothing is left over while a model still wants more (within rounding, a byte each).
    if any(shares[n] < wants[n] for n in wants):
        assert budget - sum(shares.values()) < max(1, len(wants))
