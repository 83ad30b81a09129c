"""router/generation/run.py, stream.py and router/server/sse.py: one owner of a generation's
lease and stream, and its events as OpenAI's renderer (router/api/openai/render.py) sends them.

The worker side is faked: a lease whose release is counted, and a stream that plays a script
of TokenEvents or errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, AsyncIterator

import msgspec
import pytest

from router.api.openai.render import chunks as openai_chunks
from router.api.openai.render import whole as openai_whole
from router.api.openai.shapes import Completion
from router.generation.job import GenerationJob
from router.generation.run import Generation
from router.generation.stream import events
from router.server import sse
from supervisor.config import ModelSpec
from supervisor.errors import ContextOverflow, CorralError, WorkerCrashed
from supervisor.slot_order import Place
from supervisor.slot_queue import SlotQueue, Ticket
from supervisor.lease import Lease
from worker.protocol import SamplingParams, Timings, TokenEvent, Usage

USAGE = Usage(prompt_tokens=3, completion_tokens=2)


class FakeStream:
    id = 1  # the request's id in the worker

    def __init__(self, script: list[TokenEvent | CorralError]) -> None:
        self.script = list(script)
        self.closed = 0

    async def receive(self) -> TokenEvent:
        item = self.script.pop(0)
        if isinstance(item, CorralError):
            raise item
        return item

    def close(self) -> None:
        self.closed += 1


class FakeConn:
    ready = None  # no Ready: the router's length bound does not apply

    def __init__(self, stream: FakeStream) -> None:
        self.stream = stream
        self.sent: list[tuple[SamplingParams, str | None]] = []

    def generate(self, params: SamplingParams, prompt: str | None = None, messages: Any = None, **_: Any) -> FakeStream:
        self.sent.append((params, prompt))
        return self.stream


class FakeHandle:
    def __init__(self, stream: FakeStream) -> None:
        self.spec = ModelSpec(name="m", path=Path("m.gguf"), aliases=(), idle_timeout=0.0)
        self.conn = FakeConn(stream)
        self.released = 0
        self.slot_queue = SlotQueue("m")
        self.slot_queue.resize(4)

    async def acquire(self) -> Lease:
        return Lease(self.conn, self._release)  # type: ignore[arg-type]

    async def take_slots(self, conn: object, slots: int, place: Place = Place()) -> Ticket:
        return await self.slot_queue.take(slots, None, 0, place)

    def _release(self) -> None:
        self.released += 1


def job(stream: bool = False, include_usage: bool = False) -> GenerationJob:
    return GenerationJob(
        model="m", params=SamplingParams(max_tokens=4), prompt="hi", stream=stream, include_usage=include_usage
    )


def tokens(*texts: str) -> list[TokenEvent | CorralError]:
    out: list[TokenEvent | CorralError] = [TokenEvent(id=1, text=t) for t in texts[:-1]]
    out.append(TokenEvent(id=1, text=texts[-1], finish_reason="stop", usage=USAGE))
    return out


async def started(script: list[TokenEvent | CorralError]) -> tuple[Generation, FakeHandle]:
    handle = FakeHandle(FakeStream(script))
    return await Generation.start(handle, job()), handle  # type: ignore[arg-type]


async def test_iterates_to_the_final_event_then_stops() -> None:
    gen, handle = await started(tokens("a", "b", "c"))
    got = [ev.text async for ev in gen]
    assert got == ["a", "b", "c"]
    assert [ev async for ev in gen] == []  # nothing after the final event
    assert handle.conn.sent[0][1] == "hi"


async def test_close_gives_back_the_lease_and_the_stream_once() -> None:
    gen, handle = await started(tokens("a", "b"))
    assert handle.slot_queue.busy == 1
    gen.close()
    gen.close()
    assert handle.released == 1 and handle.slot_queue.busy == 0
    assert handle.conn.stream.closed >= 1  # RequestStream.close() is itself idempotent


async def test_an_error_before_the_first_token_releases_everything_and_raises() -> None:
    """A prompt the worker refuses is a clean 4xx: the lease must not leak on the way."""
    handle = FakeHandle(FakeStream([ContextOverflow("too long", "prompt")]))
    with pytest.raises(ContextOverflow):
        await Generation.start(handle, job())  # type: ignore[arg-type]
    assert handle.released == 1 and handle.conn.stream.closed == 1 and handle.slot_queue.busy == 0


async def test_whole_joins_the_text_and_reports_the_finish() -> None:
    gen, _ = await started(tokens("Hel", "lo"))
    body = json.loads(await openai_whole(events(gen, job()), Completion("m", chat=False), job()))
    assert body["choices"][0]["text"] == "Hello"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 2


def data_lines(chunks: list[bytes]) -> list[str]:
    return [c.decode()[len("data: ") : -2] for c in chunks]


async def test_events_stream_role_text_finish_usage_and_done() -> None:
    gen, _ = await started(tokens("a", "b"))
    chunks = [c async for c in openai_chunks(events(gen, job(stream=True, include_usage=True)), Completion("m", chat=True), job(stream=True, include_usage=True))]
    assert all(c.startswith(b"data: ") and c.endswith(b"\n\n") for c in chunks)
    lines = data_lines(chunks)
    assert lines[-1] == "[DONE]"
    objs = [json.loads(x) for x in lines[:-1]]
    assert objs[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert [o["choices"][0]["delta"].get("content") for o in objs[1:3]] == ["a", "b"]
    assert objs[3]["choices"][0]["finish_reason"] == "stop"
    assert objs[4]["choices"] == [] and objs[4]["usage"]["total_tokens"] == 5
    # llama-server's last chunk carries the timings (llama.cpp's utils.py reads them there,
    # and test_chat_completion_with_timings_per_token).
    assert "timings" not in objs[4]  # none came: none is made up
    timed = tokens("a", "b")
    last = timed[-1]
    assert isinstance(last, TokenEvent)
    timed[-1] = msgspec.structs.replace(last, timings=Timings(prompt_n=3, prompt_ms=1.0, predicted_n=2, predicted_ms=2.0))
    gen, _ = await started(timed)
    chunks = [c async for c in openai_chunks(events(gen, job(stream=True, include_usage=True)), Completion("m", chat=True), job(stream=True, include_usage=True))]
    usage = [json.loads(x) for x in data_lines(chunks)[:-1]][-1]
    assert usage["choices"] == [] and usage["timings"]["predicted_n"] == 2


async def test_a_failure_mid_stream_is_a_final_error_event_without_done() -> None:
    """A cut answer must not look whole: no [DONE] after the error event."""
    gen, _ = await started([TokenEvent(id=1, text="a"), WorkerCrashed("worker died")])
    chunks = [c async for c in openai_chunks(events(gen, job(stream=True)), Completion("m", chat=False), job(stream=True))]
    last = json.loads(data_lines(chunks)[-1])
    assert last["error"]["code"] == "worker_crashed"
    assert b"[DONE]" not in b"".join(chunks)


async def _two() -> AsyncIterator[bytes]:
    yield sse.event(b"1")
    yield sse.event(b"2")


async def test_body_closes_even_when_never_iterated() -> None:
    """Pins cb0a435: the body was an async generator, whose finally never runs if iteration
    never began, so a client gone before the first chunk leaked its lease."""
    closed: list[int] = []
    body = sse.Body(_two(), lambda: closed.append(1))
    await body.aclose()  # what Quart does when the client vanished before the first chunk
    assert closed == [1]


async def test_body_iterates_then_closes_on_aclose() -> None:
    closed: list[int] = []
    body = sse.Body(_two(), lambda: closed.append(1))
    assert [c async for c in body] == [b"data: 1\n\n", b"data: 2\n\n"]
    assert closed == []  # the end of iteration is not the end of the response
    await body.aclose()
    assert closed == [1]
