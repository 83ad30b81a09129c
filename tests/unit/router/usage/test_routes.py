"""GET /admin/usage's parameters (router/usage/routes.py): every form it takes, and a 400
naming the parameter for anything else, never a 500 from the store or the clock."""

from __future__ import annotations

import datetime as dt

import pytest

from router.usage.routes import instant, report
from router.usage.store import Row
from supervisor.errors import InvalidRequest


def test_dates_times_and_epoch_seconds_are_utc_instants() -> None:
    day = dt.datetime(2026, 11, 28, tzinfo=dt.timezone.utc).timestamp()
    assert instant("2026-11-28", "from") == day
    assert instant("2026-11-28T13:00", "from") == day + 13 * 3600
    assert instant("2026-11-28T13:00Z", "from") == day + 13 * 3600
    assert instant("2026-11-28T14:00+01:00", "to") == day + 13 * 3600
    assert instant(str(day), "to") == day
    assert instant(None, "from") is None and instant("", "from") is None


@pytest.mark.parametrize("text", ["yesterday", "nan", "inf", "-1", "1e400", "99999999999999", "2026-13-01", "x" * 5000])
def test_anything_else_is_a_400_naming_the_parameter(text: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        instant(text, "from")
    assert err.value.param == "from" and len(err.value.message) < 300


def test_totals_sum_the_rows_by_key_and_model() -> None:
    rows = [
        Row("hour", 3600, "a", "m", 1, 10, 2, 5, 0, 100),
        Row("hour", 7200, "a", "m", 2, 20, 0, 7, 1, 0),
        Row("day", 0, "b", "m", 4, 1, 1, 1, 0, 0),
    ]
    out = report(rows)
    assert out["totals"] == [
        {"key": "a", "model": "m", "requests": 3, "prompt_tokens": 30, "cached_tokens": 2, "generated_tokens": 12, "errors": 1, "queue_ms": 100},
        {"key": "b", "model": "m", "requests": 4, "prompt_tokens": 1, "cached_tokens": 1, "generated_tokens": 1, "errors": 0, "queue_ms": 0},
    ]
    assert out["rows"][0]["start"] == "1970-01-01T01:00:00Z"
