"""supervisor/request_rate.py: the sliding 60 s window behind requests_per_minute."""

from __future__ import annotations

import pytest

from supervisor.request_rate import RequestRate


def test_counts_starts_within_the_window_only() -> None:
    rate = RequestRate()
    assert rate.count(1000.0) == 0
    for t in (1000.0, 1010.0, 1059.0):
        rate.record(t)
    assert rate.count(1059.0) == 3
    assert rate.count(1060.0) == 2  # the start at 1000.0 is exactly a window old: out
    assert rate.count(1069.9) == 2
    assert rate.count(1070.0) == 1
    assert rate.count(1200.0) == 0


def test_memory_is_bounded_by_the_window() -> None:
    rate = RequestRate(window=10.0)
    for i in range(10_000):
        rate.record(i * 0.5)  # two a second
    assert rate.count(4999.5) == 20
    assert len(rate._starts) == 20


@pytest.mark.parametrize("window", [0.0, -1.0, float("nan")])
def test_a_window_that_is_not_positive_is_refused(window: float) -> None:
    with pytest.raises(ValueError, match="window must be positive"):
        RequestRate(window)
