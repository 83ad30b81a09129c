"""The usage ledger's SQLite file (router/usage/store.py): sums by hour, roll-up into days
that keeps every count, bounds, and the file itself."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from router.usage.entries import DAY, HOUR, Entry, day_of
from router.usage.store import COUNTS, UsageStore

T0 = 1_795_000_000.0  # 2026-11-18, a fixed clock


def e(at: float, key: str = "alice", model: str = "m", prompt: int = 10, cached: int = 0, gen: int = 5,
      error: bool = False, queue: float = 0.0) -> Entry:
    return Entry(at, key, "id-" + key, model, prompt, cached, gen, error, queue)


def totals(store: UsageStore) -> dict[str, int]:
    rows = store.rows("day")
    return {c: sum(getattr(r, c) for r in rows) for c in COUNTS}


def test_requests_of_one_hour_key_and_model_are_one_row_of_sums() -> None:
    s = UsageStore(None)
    s.add([e(T0, prompt=10, cached=4, gen=5), e(T0 + 60, prompt=3, gen=1, error=True, queue=0.25)])
    s.add([e(T0 + 120, key="bob"), e(T0 + 2 * HOUR)])
    rows = s.rows("hour")
    assert [(r.key, r.requests) for r in rows] == [("alice", 2), ("bob", 1), ("alice", 1)]
    first = rows[0]
    assert (first.prompt_tokens, first.cached_tokens, first.generated_tokens, first.errors, first.queue_ms) == (
        13, 4, 6, 1, 250,
    )
    assert first.period == "hour" and first.start % HOUR == 0


def test_filters_select_key_model_and_a_half_open_range() -> None:
    s = UsageStore(None)
    s.add([e(T0), e(T0, model="n"), e(T0, key="bob"), e(T0 + HOUR)])
    assert [r.model for r in s.rows("hour", key="alice", model="n")] == ["n"]
    start = s.rows("hour")[0].start
    assert {r.start for r in s.rows("hour", since=start, until=start + HOUR)} == {start}
    assert s.rows("hour", since=start + HOUR)[0].requests == 1


def test_old_hours_roll_up_into_days_and_days_past_the_bound_go() -> None:
    s = UsageStore(None)
    s.add([e(T0 - 20 * DAY), e(T0 - 20 * DAY + HOUR), e(T0 - 3 * DAY), e(T0)])
    s.roll_up(T0, hourly_for=2 * DAY, daily_for=10 * DAY)
    rows = s.rows("hour")
    assert [r.period for r in rows] == ["day", "hour"]  # the 20-day-old day went; 3 days ago is a day
    assert rows[0].start == day_of(T0 - 3 * DAY)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 30 * DAY), st.sampled_from(["a", "b"]), st.integers(0, 1000), st.booleans()), max_size=40),
    st.floats(0, 30 * DAY),
)
def test_rolling_up_keeps_every_count(items: list[tuple[float, str, int, bool]], hourly_for: float) -> None:
    s = UsageStore(None)
    s.add([e(T0 - ago, key=k, prompt=n, gen=n // 2, error=err) for ago, k, n, err in items])
    before = totals(s)
    s.roll_up(T0, hourly_for=hourly_for, daily_for=0)
    assert totals(s) == before
    # and no hour of a day older than the bound is left
    assert all(r.period == "day" or r.start >= day_of(T0 - hourly_for) for r in s.rows("hour"))


def test_tokens_since_counts_a_keys_prompt_and_generated_tokens_by_its_id() -> None:
    s = UsageStore(None)
    s.add([e(T0, prompt=10, gen=5), e(T0 - DAY), e(T0, key="bob", prompt=1, gen=1)])
    assert s.tokens_since(day_of(T0)) == {"id-alice": 15, "id-bob": 2}


def test_the_file_is_wal_and_outlives_its_store(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"
    s = UsageStore(path)
    s.add([e(T0)])
    s.close()
    again = UsageStore(path)
    assert again.rows("hour")[0].requests == 1
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_ledger_from_a_newer_corral_is_refused_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    try:
        UsageStore(path)
    except RuntimeError as exc:
        assert "schema version 99" in str(exc)
    else:
        raise AssertionError("a newer ledger was opened")
