"""A request's hold on a model's worker, and the one load that every waiter shares."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable

import trio

from supervisor.connection import WorkerConnection
from supervisor.errors import WorkerUnavailable


@dataclass(eq=False)
class LoadAttempt:
    """One load that every waiter shares; a failed load fails all of them.

    It is wanted while a request waits on it, or until `keep_until` (trio clock) for a
    load that nobody waits on (preload). An unwanted attempt leaves the load queue.
    """

    done: trio.Event = field(default_factory=trio.Event)
    error: WorkerUnavailable | None = None
    waiters: int = 0
    keep_until: float = 0.0

    def finish(self, error: WorkerUnavailable | None = None) -> None:
        self.error = error
        self.done.set()


class Lease:
    """A request's hold on a ready worker. `release()` is idempotent and never blocks, so it
    is safe in a `finally` that runs during cancellation."""

    def __init__(self, conn: WorkerConnection, release: Callable[[], None]) -> None:
        self.conn = conn
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


@asynccontextmanager
async def leased(acquire: Callable[[], Awaitable[Lease]]) -> AsyncIterator[WorkerConnection]:
    """A lease from `acquire` for the duration of a block: its worker, released after."""
    held = await acquire()
    try:
        yield held.conn
    finally:
        held.release()
