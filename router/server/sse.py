"""Server-sent events: the framing, the headers, and a body that always cleans up.

Every dialect that streams SSE frames its events here; the dialects build the objects.
"""

from __future__ import annotations

from typing import AsyncIterator, Awaitable, Callable

HEADERS = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",  # nginx: pass events through as they come
}


def event(payload: bytes) -> bytes:
    """One event whose data is `payload` (JSON, which never holds a raw newline)."""
    return b"data: " + payload + b"\n\n"


class Body:
    """A streamed body whose `on_close` runs however the body ends, iterated or not.

    An async generator that never started never runs its `finally`: a client that vanishes
    between the headers and the first event would leak what the stream holds (a lease, so
    the model could never unload, and a generation the worker keeps running). Quart calls
    `aclose()` on a body iterator whether or not it was iterated, so cleanup lives there.
    `on_close` must be idempotent and must not block; `then`, where given, is awaited after
    it (closing an upstream's connection: router/upstream/remote.py).
    """

    def __init__(
        self, events: AsyncIterator[bytes], on_close: Callable[[], None],
        then: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._events, self._on_close, self._then = events, on_close, then

    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> bytes:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        try:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self._on_close()
            if self._then is not None:
                await self._then()
