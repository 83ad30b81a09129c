"""The SSE body releases its lease and cancels its generation even if it never ran."""

from __future__ import annotations

from typing import Any, AsyncIterator

from router.app import _SSEBody


class FakeStream:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class FakeLease:
    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1


async def _chunks() -> AsyncIterator[bytes]:
    yield b"data: 1\n\n"
    yield b"data: 2\n\n"


async def test_aclose_before_iteration_still_releases() -> None:
    """Pins cb0a435: the body was an async generator, whose finally never runs if iteration
    never began, so a client gone before the first chunk leaked its lease."""
    stream, lease = FakeStream(), FakeLease()
    body = _SSEBody(_chunks(), stream, lease)  # type: ignore[arg-type]
    await body.aclose()  # what Quart does when the client vanished before the first chunk
    assert stream.closed == 1 and lease.released == 1


async def test_iterates_the_generator_then_releases_on_close() -> None:
    stream, lease = FakeStream(), FakeLease()
    body: Any = _SSEBody(_chunks(), stream, lease)  # type: ignore[arg-type]
    assert [c async for c in body] == [b"data: 1\n\n", b"data: 2\n\n"]
    assert lease.released == 0  # the generator itself owns release on the normal path
    await body.aclose()
    assert stream.closed == 1 and lease.released == 1
