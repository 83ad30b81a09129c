"""The usage ledger's SQLite file: counts by period, key, model, bounded in size.

One row per UTC hour, key and model holds the sums of its requests (rows are upserted, so
a busy hour is one row however many requests it had). Hours older than `hourly_for` roll up
into one row per UTC day; days older than `daily_for` are dropped (0: kept). A year of 100
keys on 20 models is then at most 730,000 day rows, and the hours of the last two weeks.

Used from one thread only (router/usage/ledger.py): sqlite3 connections are not to be
shared across threads, and one writer needs no locking of its own. WAL lets `sqlite3` on
the command line read the file while the server writes it; `synchronous = NORMAL` under
WAL loses at most the last transactions on a power cut, never the file.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

from router.usage.entries import DAY, Entry, day_of, hour_of

SCHEMA_VERSION = 1
COUNTS = ("requests", "prompt_tokens", "cached_tokens", "generated_tokens", "errors", "queue_ms")
_KEY = ("period", "start", "key_id", "key", "model")

_CREATE = f"""
CREATE TABLE IF NOT EXISTS usage (
    period TEXT NOT NULL CHECK (period IN ('hour', 'day')),
    start INTEGER NOT NULL,
    key_id TEXT NOT NULL,
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    {", ".join(f"{c} INTEGER NOT NULL DEFAULT 0" for c in COUNTS)},
    PRIMARY KEY ({", ".join(_KEY)})
) WITHOUT ROWID
"""
_ADD_UP = ", ".join(f"{c} = {c} + excluded.{c}" for c in COUNTS)
_UPSERT = (
    f"INSERT INTO usage ({', '.join(_KEY)}, {', '.join(COUNTS)}) VALUES ({', '.join('?' * (len(_KEY) + len(COUNTS)))}) "
    f"ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET {_ADD_UP}"
)
_SUMS = ", ".join(f"SUM({c}) AS {c}" for c in COUNTS)

Period = Literal["hour", "day"]


@dataclass(frozen=True)
class Row:
    period: str  # "hour" or "day": what `start` begins
    start: int  # epoch seconds, UTC
    key: str
    model: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    errors: int
    queue_ms: int


class UsageStore:
    def __init__(self, path: Path | None) -> None:
        """`path` None: in memory, for a server without a state_dir (lost at exit)."""
        self.path = path
        self._db = sqlite3.connect(":memory:" if path is None else str(path), isolation_level=None)
        self._db.row_factory = sqlite3.Row
        if path is not None:
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise RuntimeError(
                f"{path}: a usage ledger of schema version {version}, newer than this Corral's {SCHEMA_VERSION}"
            )
        self._db.execute(_CREATE)
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def add(self, entries: Iterable[Entry]) -> int:
        """Count `entries` into their hours, in one transaction; returns how many rows it touched."""
        sums: dict[tuple[str, int, str, str, str], list[int]] = defaultdict(lambda: [0] * len(COUNTS))
        for e in entries:
            row = sums[("hour", hour_of(e.at), e.key_id, e.key, e.model)]
            for i, n in enumerate(
                (1, e.prompt_tokens, e.cached_tokens, e.generated_tokens, int(e.error), round(e.queue_seconds * 1000))
            ):
                row[i] += n
        if sums:
            with self._transaction():
                self._db.executemany(_UPSERT, [(*k, *v) for k, v in sums.items()])
        return len(sums)

    def roll_up(self, now: float, hourly_for: float, daily_for: float) -> None:
        """Hours of days that ended more than `hourly_for` ago into day rows; day rows older
        than `daily_for` (when not 0) out."""
        cutoff = day_of(now - hourly_for)  # whole days only: a day row never holds part of a day
        with self._transaction():
            self._db.execute(
                f"INSERT INTO usage ({', '.join(_KEY)}, {', '.join(COUNTS)}) "
                f"SELECT 'day', (start / {DAY}) * {DAY}, key_id, key, model, {_SUMS} FROM usage "
                f"WHERE period = 'hour' AND start < ? GROUP BY 2, key_id, key, model "
                f"ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET {_ADD_UP}",
                (cutoff,),
            )
            self._db.execute("DELETE FROM usage WHERE period = 'hour' AND start < ?", (cutoff,))
            if daily_for > 0:
                self._db.execute("DELETE FROM usage WHERE period = 'day' AND start < ?", (day_of(now - daily_for),))

    def rows(
        self, by: Period, since: float | None = None, until: float | None = None,
        key: str | None = None, model: str | None = None,
    ) -> list[Row]:
        """Counts by `by` ("hour": each hour still kept by the hour, and older days as days;
        "day": by UTC day), key and model, oldest first, for periods starting in [since, until)."""
        start = "start" if by == "hour" else f"(start / {DAY}) * {DAY}"
        period = "period" if by == "hour" else "'day'"
        where, args = _filters(since, until, key, model)
        query = (
            f"SELECT {period} AS period, {start} AS start, key, model, {_SUMS} FROM usage {where} "
            f"GROUP BY 1, 2, key, model ORDER BY 2, key, model"
        )
        return [Row(**dict(r)) for r in self._db.execute(query, args)]

    def tokens_since(self, since: float) -> dict[str, int]:
        """Prompt and generated tokens of each key_id in periods starting at `since` or later
        (the day's, for tokens_per_day after a restart)."""
        query = "SELECT key_id, SUM(prompt_tokens + generated_tokens) FROM usage WHERE start >= ? GROUP BY key_id"
        return {k: int(n) for k, n in self._db.execute(query, (int(since),))}

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


def _filters(since: float | None, until: float | None, key: str | None, model: str | None) -> tuple[str, list[object]]:
    parts: list[str] = []
    args: list[object] = []
    for clause, value in (("start >= ?", since), ("start < ?", until), ("key = ?", key), ("model = ?", model)):
        if value is not None:
            parts.append(clause)
            args.append(int(value) if isinstance(value, float) else value)
    return ("WHERE " + " AND ".join(parts)) if parts else "", args


class _Transaction:
    """BEGIN ... COMMIT, or ROLLBACK on an error (the connection is in autocommit mode, so
    that a read never holds a transaction open against the WAL's checkpoints)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")
