"""The benchmarks' bootstrap intervals (bench/intervals.py)."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings, strategies as st

from bench.intervals import clustered_median_interval, median_interval

ratios = st.lists(st.floats(0.5, 1.5), min_size=1, max_size=30)


@settings(max_examples=50, deadline=None)
@given(ratios)
def test_the_interval_holds_the_median_and_lies_within_the_data(xs: list[float]) -> None:
    lo, hi = median_interval(xs, draws=400)
    assert min(xs) <= lo <= hi <= max(xs)
    # The sample's own median is one of the draws' most likely values: never outside.
    assert lo <= statistics.median(xs) <= hi


@settings(max_examples=50, deadline=None)
@given(st.lists(ratios, min_size=1, max_size=6))
def test_the_clustered_interval_lies_within_the_data(groups: list[list[float]]) -> None:
    lo, hi = clustered_median_interval(groups, draws=400)
    flat = [x for g in groups for x in g]
    assert min(flat) <= lo <= hi <= max(flat)


def test_one_group_is_the_plain_bootstrap() -> None:
    xs = [0.98, 1.01, 1.02, 0.99, 1.03, 1.0]
    assert clustered_median_interval([xs]) == median_interval(xs)


def test_starts_that_disagree_widen_the_interval_that_rounds_alone_would_narrow() -> None:
    # Two starts, each tight around its own level: pooled as one start the interval is
    # narrow and excludes one of the two levels; as two starts it spans both.
    a = [0.985 + 0.001 * i for i in range(10)]
    b = [1.015 + 0.001 * i for i in range(10)]
    lo1, hi1 = median_interval(a + b)
    lo2, hi2 = clustered_median_interval([a, b])
    assert hi2 - lo2 > hi1 - lo1
    assert lo2 < 0.99 and hi2 > 1.015


def test_no_ratios_is_an_error() -> None:
    with pytest.raises(ValueError):
        median_interval([])
    with pytest.raises(ValueError):
        clustered_median_interval([[], []])
