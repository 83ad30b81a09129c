"""The admission gate: one queue for every model that wants to load, first come first served.

A handle calls `admit()` before it spawns a worker. Under `max_loaded_models` and
`memory_budget` the gate asks capacity.plan what to do: admit, evict the least recently
used idle models and wait for them to stop, or wait for a busy model to finish. Only the
head of the queue is planned for, so a large model is not starved by small ones that keep
slipping past it. A handle whose waiters have all gone (timed out or disconnected) leaves
the queue, and the next one is planned for at once.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable, Iterable, Protocol

import trio

from supervisor.capacity import Admit, Evict, Limits, Resident, Wait, plan

log = logging.getLogger("corral.supervisor")


class Loadable(Protocol):
    """What the gate needs of a model (supervisor.handle.Loadable in the server)."""

    @property
    def name(self) -> str: ...

    @property
    def holds_memory(self) -> bool:
        """Loading, ready, draining or stopping: it counts against the limits."""
        ...

    def wanted(self) -> bool:
        """Does a request, or a preload, still want its pending load?"""
        ...

    def estimated_cost(self) -> int: ...

    def estimated_gpu(self) -> dict[str, int]: ...

    def resident(self) -> Resident: ...

    def request_unload(self, force: bool = False, reason: str = "") -> None: ...


class Admission:
    def __init__(self, handles: Callable[[], Iterable[Loadable]], limits: Callable[[], Limits]):
        self._handles = handles
        self._limits = limits
        self._queue: deque[Loadable] = deque()
        self._reasons: dict[str, str] = {}  # why each queued model waits, once planned
        self._version = 0
        self._changed = trio.Event()

    def poke(self) -> None:
        """Something that matters to the plan changed: a state, a request count, a waiter."""
        self._version += 1
        self._changed.set()
        self._changed = trio.Event()

    def queued(self) -> list[str]:
        return [h.name for h in self._queue]

    def waiting_reason(self, handle: Loadable) -> str | None:
        """Why a queued model has not started yet (None if it is not queued)."""
        if handle not in self._queue:
            return None
        return self._reasons.get(handle.name, "waiting for its turn in the load queue")

    async def admit(self, handle: Loadable) -> bool:
        """Return True when `handle` may start loading (at once when there are no limits),
        or False once nobody wants it any more."""
        if self._limits().unlimited and not self._queue:
            return True
        self._queue.append(handle)
        try:
            while True:
                version = self._version
                if not handle.wanted():
                    log.info("%s: left the load queue (no request waits for it)", handle.name)
                    return False
                if self._queue[0] is handle:
                    cost = handle.estimated_cost()
                    decision = plan(handle.name, cost, self._residents(handle), self._limits(), handle.estimated_gpu())
                    if isinstance(decision, Admit):
                        return True
                    if isinstance(decision, Evict):
                        by_name = {h.name: h for h in self._handles()}
                        for victim in decision.victims:
                            by_name[victim].request_unload(
                                reason=f"evicted to make room for {handle.name}"
                            )
                    elif isinstance(decision, Wait) and decision.reason != self._reasons.get(handle.name):
                        self._reasons[handle.name] = decision.reason
                        log.info("%s: queued to load: %s", handle.name, decision.reason)
                if self._version == version:  # no news while we looked: sleep until some
                    await self._changed.wait()
        finally:
            self._queue.remove(handle)
            self._reasons.pop(handle.name, None)
            self.poke()  # the next in line may go now

    def _residents(self, newcomer: Loadable) -> list[Resident]:
        return [h.resident() for h in self._handles() if h is not newcomer and h.holds_memory]
