"""An in-process simulated worker, for lifecycle tests under trio's virtual clock.

The process fake (tests/fake_worker.py) is the right tool for what only a real process
shows: signals, kill -9, exit codes, orphaned sockets. Timing logic (backoff, idle unload,
health misses, capacity waits) is better tested here: the simulated worker is a trio task
that speaks the real frame protocol over an in-memory stream, so with `autojump_clock` a
test of a 60-second backoff runs in milliseconds and its timings are exact.

`SimLauncher` implements supervisor.launcher.Launcher. Each start consults the model's
`Behaviour` (tests/behaviour.py, shared with the process fake), which a test may change
between starts (for a crash loop that gets fixed). Of its fields the sim acts on load_delay,
fail_load, exit_at_start, tokens_per_sec, hang, ignore_shutdown and die_after; the others
(start_log, alloc_mb, crash_after, ignore_sigterm) are the process fake's alone and are
ignored here. Tokenize, Detokenize, Render and SlotsQuery are answered as
tests/fake_answers.py says, and a Generate's prompt_parts are checked against its
vocabulary, so llama-server's routes can be tested here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable

import trio
import trio.testing

from supervisor.connection import WorkerConnection
from supervisor.launcher import LoadFailed, wait_until_ready
from tests import fake_answers
from tests.behaviour import Behaviour
from worker.protocol import (
    Cancel,
    Detokenize,
    Failed,
    Frame,
    FrameBuffer,
    Generate,
    Loading,
    Ping,
    Pong,
    Ready,
    Render,
    SetCacheBudget,
    SetThreads,
    Shutdown,
    SlotsQuery,
    SlotsResult,
    SlotState,
    Step,
    Tokenize,
    TokenEvent,
    Usage,
    WorkerSpec,
    decode_to_worker,
    encode,
)


@dataclass
class Start:
    """One start of one model, as the launcher saw it."""

    name: str
    at: float  # trio clock
    threads: int | None
    conn: WorkerConnection
    set_threads: list[int] = field(default_factory=list)  # SetThreads frames received
    prompt_cache_bytes: int = 0  # what the worker was started with
    cache_budgets: list[int] = field(default_factory=list)  # SetCacheBudget frames received


class SimLauncher:
    def __init__(self, behaviours: dict[str, Behaviour] | None = None) -> None:
        self.behaviours = behaviours if behaviours is not None else {}
        self.starts: list[Start] = []
        self.stops: list[tuple[str, float]] = []  # (name, trio clock) of each graceful stop

    def behaviour(self, name: str) -> Behaviour:
        return self.behaviours.setdefault(name, Behaviour())

    def starts_of(self, name: str) -> list[Start]:
        return [s for s in self.starts if s.name == name]

    async def start(
        self, nursery: trio.Nursery, spec: WorkerSpec, on_close: Callable[[], None],
        on_progress: Callable[[float], None] | None = None,
    ) -> WorkerConnection:
        ours, theirs = trio.testing.memory_stream_pair()
        conn = WorkerConnection(spec.name, ours, on_close, on_progress)
        record = Start(spec.name, trio.current_time(), spec.threads, conn, prompt_cache_bytes=spec.prompt_cache_bytes)
        self.starts.append(record)
        nursery.start_soon(conn.reader)
        nursery.start_soon(conn.writer)
        nursery.start_soon(_simulate, theirs, spec, self.behaviour(spec.name), record)
        await wait_until_ready(conn)
        if conn.ready is None:
            raise LoadFailed(conn.failed_message or "worker exited during load")
        return conn

    async def stop(self, conn: WorkerConnection, grace: float) -> None:
        self.stops.append((conn.name, trio.current_time()))
        if not conn.closed.is_set():
            conn.send(Shutdown(grace=grace))
        with trio.move_on_after(grace + 1.0):
            await conn.closed.wait()
            return
        conn.kill("did not exit after Shutdown")


async def _simulate(
    stream: trio.abc.Stream, spec: WorkerSpec, b: Behaviour, record: Start
) -> None:
    lock = trio.Lock()  # one send_all at a time: generations and Pongs share the stream

    async def send(frame: Frame) -> None:
        async with lock:
            await stream.send_all(encode(frame))

    async with stream:
        if b.exit_at_start:
            return
        await send(Loading(progress=0.0))
        await trio.sleep(b.load_delay)
        if b.fail_load is not None:
            await send(Failed(message=b.fail_load))
            return
        await send(
            Ready(
                n_ctx=spec.n_ctx, n_ctx_slot=spec.n_ctx, slots=spec.slots, n_vocab=32000,
                n_ctx_train=32768, has_template=True, embeddings=spec.embeddings, n_embd=16,
            )
        )
        if b.hang:
            await trio.sleep_forever()
        async with trio.open_nursery() as nursery:
            if b.die_after is not None:

                async def die() -> None:
                    await trio.sleep(b.die_after or 0.0)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(die)
            running: dict[int, trio.CancelScope] = {}
            frames = FrameBuffer()
            while True:
                data = await stream.receive_some(1 << 16)
                if not data:
                    break  # EOF: the supervisor is gone
                for body in frames.feed(data):
                    frame = decode_to_worker(body)
                    if isinstance(frame, Ping):
                        await send(Pong(seq=frame.seq, active=len(running)))
                    elif isinstance(frame, Generate):
                        err = fake_answers.bad_id(frame.id, frame.prompt_parts or [], "prompt")
                        if err is not None:
                            await send(err)
                        else:
                            nursery.start_soon(_generate, send, frame, b.tokens_per_sec, running)
                    elif isinstance(frame, Tokenize):
                        await send(fake_answers.tokenize_result(frame.id, frame.text, frame.add_special, frame.with_pieces))
                    elif isinstance(frame, Detokenize):
                        await send(fake_answers.detokenize(frame.id, frame.tokens))
                    elif isinstance(frame, Render):
                        await send(fake_answers.render(frame.id, frame.messages))
                    elif isinstance(frame, SlotsQuery):
                        busy = sorted(running)
                        slots = [
                            SlotState(
                                id=i, n_ctx=spec.n_ctx, is_processing=i < len(busy),
                                id_task=busy[i] if i < len(busy) else -1,
                            )
                            for i in range(spec.slots)
                        ]
                        await send(SlotsResult(id=frame.id, slots=slots))
                    elif isinstance(frame, Cancel):
                        scope = running.pop(frame.id, None)
                        if scope is not None:
                            scope.cancel()
                    elif isinstance(frame, SetThreads):
                        record.set_threads.append(frame.n_threads)
                    elif isinstance(frame, SetCacheBudget):
                        record.cache_budgets.append(frame.n_bytes)
                    elif isinstance(frame, Shutdown) and not b.ignore_shutdown:
                        nursery.cancel_scope.cancel()
            nursery.cancel_scope.cancel()


async def _generate(
    send: Callable[[Frame], Awaitable[None]],
    g: Generate,
    tokens_per_sec: float,
    running: dict[int, trio.CancelScope],
) -> None:
    """`max_tokens` words (8 if unset), one per step: "tok0", " tok1", ...; each of the
    Generate's n choices gets the same words, its events saying its index."""
    n = 8 if g.params.max_tokens is None else g.params.max_tokens
    choices = range(max(g.n, 1))
    with trio.CancelScope() as scope:
        running[g.id] = scope
        for i in range(n):
            await trio.sleep(1.0 / tokens_per_sec)
            if i < n - 1:
                await send(Step(events=[TokenEvent(id=g.id, text=_word(i), index=j) for j in choices]))
        await send(
            Step(
                events=[
                    TokenEvent(
                        id=g.id,
                        text=_word(n - 1) if n else "",
                        finish_reason="length",
                        usage=Usage(prompt_tokens=fake_answers.prompt_tokens(g), completion_tokens=n),
                        stop_type="limit",
                        timings=fake_answers.timings(fake_answers.prompt_tokens(g), n, 1.0 / tokens_per_sec),
                        id_slot=0,
                        index=j,
                    )
                    for j in choices
                ]
            )
        )
    running.pop(g.id, None)


def _word(i: int) -> str:
    return f"tok{i}" if i == 0 else f" tok{i}"
