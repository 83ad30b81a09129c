"""The ledger's thread (router/usage/ledger.py): a read sees every entry recorded before
it, a close writes what is queued, a bad path fails at start."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from router.usage.entries import Entry
from router.usage.ledger import Ledger
from router.usage.store import UsageStore


def entry(n: int) -> Entry:
    return Entry(time.time(), "alice", "id-alice", "m", n, 0, 1)


def requests(store: UsageStore) -> int:
    return sum(r.requests for r in store.rows("hour"))


def test_a_read_after_records_sees_them_all() -> None:
    ledger = Ledger(None, 86400, 0)
    for n in range(500):
        ledger.record(entry(n))

    async def main() -> int:
        return await ledger.ask(requests)

    assert trio.run(main) == 500
    ledger.close()


def test_close_writes_what_is_queued_and_a_new_ledger_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"
    ledger = Ledger(path, 86400, 0)
    for n in range(3):
        ledger.record(entry(n))
    ledger.close()
    ledger.close()  # idempotent
    again = Ledger(path, 86400, 0)
    assert again.ask_now(requests) == 3
    assert again.ask_now(lambda s: s.tokens_since(0)) == {"id-alice": 0 + 1 + 2 + 3}
    again.close()


def test_a_ledger_that_cannot_open_its_file_fails_at_once(tmp_path: Path) -> None:
    with pytest.raises(Exception):
        Ledger(tmp_path / "no-such-folder" / "usage.sqlite3", 86400, 0)


def test_an_error_in_a_read_is_the_askers_and_the_thread_goes_on() -> None:
    ledger = Ledger(None, 86400, 0)

    def boom(store: UsageStore) -> int:
        raise ValueError("bad query")

    with pytest.raises(ValueError):
        ledger.ask_now(boom)
    ledger.record(entry(1))
    assert ledger.ask_now(requests) == 1
    ledger.close()
