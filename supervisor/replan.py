"""One task that re-plans after changes: many "something changed" calls, one plan run.

Every state change and every finished request may change the load queue's plan and the
division of the cores. Running the plan inside whichever task noticed the change (a
request's `lease.release()`, another model's run loop) made that task write into other
models' handles. Here those tasks only ask; the plan runs in its own task, once for any
number of asks made while it was busy, and what it decides reaches each handle as a request
that the handle's own run loop applies.
"""

from __future__ import annotations

from typing import Callable, Protocol

import trio


class Planner(Protocol):
    def changed(self) -> None:
        """Something that matters to the plan changed. Never blocks."""
        ...

    async def settled(self) -> None:
        """Return once a plan has run that saw every change asked for before this call."""
        ...


class Replanner:
    def __init__(self, plan: Callable[[], None]) -> None:
        self._plan = plan
        self._asked = 0
        self._done = 0
        self._wanted = trio.Event()
        self._finished = trio.Event()

    def changed(self) -> None:
        """Something that matters to the plan changed. Never blocks."""
        self._asked += 1
        self._wanted.set()

    async def settled(self) -> None:
        """Return once a plan has run that saw every change asked for before this call."""
        ticket = self._asked
        while self._done < ticket:
            await self._finished.wait()

    async def run(self) -> None:
        while True:
            while self._done >= self._asked:
                await self._wanted.wait()
                self._wanted = trio.Event()
            ticket = self._asked
            self._plan()
            self._done = ticket
            self._finished.set()
            self._finished = trio.Event()


class Immediate:
    """The planner of a handle without a supervisor (tests): nothing to plan."""

    def changed(self) -> None:
        pass

    async def settled(self) -> None:
        pass
