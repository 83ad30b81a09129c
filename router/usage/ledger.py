"""The ledger's one thread: every write and read of the usage file, off the event loop.

A finished request's entry is put on a queue (never blocks: the access log's DONE hooks
run on the event loop as each answer ends). The thread writes what has come every
`FLUSH` seconds in one transaction, so a burst of a thousand requests is one commit, and
rolls old hours up into days once an hour. Reads (GET /admin/usage, `corral usage`) are
jobs on the same queue, answered in order after the writes before them: a report never
misses a request that ended before it was asked for, once that request's entry is queued.

A restart loses at most the entries of the last FLUSH seconds that were not written; a
stop (`close`) writes them all first.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Generic, TypeVar

import trio

from router.usage.entries import Entry
from router.usage.store import UsageStore

log = logging.getLogger("corral.usage")

FLUSH = 0.5  # seconds between writes: what a crash may lose
ROLL_UP_EVERY = 3600.0
T = TypeVar("T")


@dataclass(eq=False)
class _Job(Generic[T]):
    run: Callable[[UsageStore], T]
    done: threading.Event = field(default_factory=threading.Event)
    result: T | None = None
    error: BaseException | None = None


class Ledger:
    def __init__(self, path: Path | None, hourly_for: float, daily_for: float) -> None:
        """Opens (or makes) the file at once, so that a bad state_dir fails `corral serve`
        at start, not at the first request."""
        self.path = path
        self.hourly_for, self.daily_for = hourly_for, daily_for
        self._todo: queue.SimpleQueue[Entry | _Job[object] | None] = queue.SimpleQueue()
        # The file is opened on the thread that uses it (sqlite3 objects stay in theirs).
        opened: _Job[UsageStore] = _Job(lambda _: self._open())
        self._thread = threading.Thread(target=self._loop, args=(opened,), name="usage-ledger", daemon=True)
        self._thread.start()
        opened.done.wait()
        if opened.error is not None:
            raise opened.error

    def _open(self) -> UsageStore:
        store = UsageStore(self.path)
        store.roll_up(time.time(), self.hourly_for, self.daily_for)
        return store

    def record(self, entry: Entry) -> None:
        """Count a finished request (any thread; never blocks)."""
        self._todo.put(entry)

    async def ask(self, run: Callable[[UsageStore], T]) -> T:
        """`run(store)` on the ledger's thread, after every entry recorded before it."""
        job: _Job[T] = _Job(run)
        self._todo.put(job)  # type: ignore[arg-type]
        await trio.to_thread.run_sync(job.done.wait, abandon_on_cancel=True)
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def ask_now(self, run: Callable[[UsageStore], T]) -> T:
        """`ask`, from a thread that is not the event loop's (the CLI's tests, startup)."""
        job: _Job[T] = _Job(run)
        self._todo.put(job)  # type: ignore[arg-type]
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def close(self) -> None:
        """Write what is queued, and close the file. Idempotent."""
        if self._thread.is_alive():
            self._todo.put(None)
            self._thread.join()

    def _loop(self, opened: _Job[UsageStore]) -> None:
        try:
            self._store = opened.run(None)  # type: ignore[arg-type]
        except BaseException as exc:
            opened.error = exc
            opened.done.set()
            return
        opened.done.set()
        pending: list[Entry] = []
        next_roll = time.monotonic() + ROLL_UP_EVERY
        deadline: float | None = None
        try:
            while True:
                item: Entry | _Job[object] | None | object
                try:
                    item = self._todo.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    item = _FLUSH_NOW
                if isinstance(item, Entry):
                    pending.append(item)
                    if deadline is None:
                        deadline = time.monotonic() + FLUSH
                    continue
                self._write(pending)  # before a job, or a stop, or at the deadline
                pending, deadline = [], None
                if item is None:
                    return
                if isinstance(item, _Job):
                    self._answer(item)
                if time.monotonic() >= next_roll:
                    next_roll = time.monotonic() + ROLL_UP_EVERY
                    self._safely(lambda: self._store.roll_up(time.time(), self.hourly_for, self.daily_for))
        finally:
            self._store.close()

    def _write(self, entries: list[Entry]) -> None:
        if entries:
            self._safely(lambda: self._store.add(entries))

    def _answer(self, job: _Job[object]) -> None:
        try:
            job.result = job.run(self._store)
        except BaseException as exc:  # the asker's to raise, never the thread's end
            job.error = exc
        job.done.set()

    def _safely(self, write: Callable[[], object]) -> None:
        # A full disk or a locked file costs the usage of these requests, said in the log,
        # never the server: the requests themselves were answered.
        try:
            write()
        except Exception:
            log.exception("writing the usage ledger (%s) failed", self.path or "in memory")


_FLUSH_NOW = object()
