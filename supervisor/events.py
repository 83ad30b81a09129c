"""Lifecycle events, for whoever watches (GET /admin/events, the dashboard of a later issue).

`publish` never blocks and never waits on a subscriber: each subscriber has a bounded
buffer, and one that falls behind loses its oldest events, and is told how many it lost,
rather than slowing the supervisor down or growing without bound. Events are plain dicts
with a `type` and a `time` (Unix seconds):

- `state`: a model changed state (`model`, `state`, `previous`, `reason`, `pid`);
- `load_progress`: a loading worker's progress (`model`, `progress` 0..1);
- `unloading`: an unload began (`model`, `reason`: an admin's, or "evicted to make room
  for ...", `force`);
- `reload`: a reload applied (`added`, `removed`, `changed`, `needs_restart`);
- `config_error`: a reload refused (`problems`);
- `dropped`: this subscriber lost `count` events, being too slow.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import trio

# Events a subscriber may have unread before the oldest go: a load's progress, and every
# state change of many models, fit with room to spare.
BUFFER = 256


class Subscription:
    def __init__(self, bus: EventBus, size: int) -> None:
        self._bus = bus
        self._events: deque[dict[str, Any]] = deque()
        self._size = size
        self._wake = trio.Event()
        self.dropped = 0

    def _offer(self, event: dict[str, Any]) -> None:
        if len(self._events) >= self._size:
            self._events.popleft()
            self.dropped += 1
        self._events.append(event)
        self._wake.set()

    async def next(self) -> dict[str, Any]:
        """The next event; a `dropped` event first if some were lost meanwhile."""
        while not self._events:
            await self._wake.wait()
            self._wake = trio.Event()
        if self.dropped:
            count, self.dropped = self.dropped, 0
            return {"type": "dropped", "time": time.time(), "count": count}
        return self._events.popleft()

    def close(self) -> None:
        self._bus._subscribers.discard(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventBus:
    def __init__(self) -> None:
        self._subscribers: set[Subscription] = set()

    def subscribe(self, size: int = BUFFER) -> Subscription:
        sub = Subscription(self, size)
        self._subscribers.add(sub)
        return sub

    def publish(self, type_: str, **fields: Any) -> None:
        """Hand the event to every subscriber's buffer. Never blocks."""
        if not self._subscribers:
            return
        event = {"type": type_, "time": time.time(), **fields}
        for sub in self._subscribers:
            sub._offer(event)
