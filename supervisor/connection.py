"""One worker process and the frame connection to it.

`open_worker` spawns `python -m worker` with one end of a socketpair passed through
`pass_fds`, starts a reader and a writer task in the caller's nursery, and returns once the
worker has sent Ready. Many requests share the connection: each gets an unbounded channel
keyed by request id, so a slow client never stalls the reader for everyone else.

When the worker dies or breaks the protocol, every request in flight gets WorkerCrashed at
once, and `closed` is set.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, Union

import msgspec
import trio

from supervisor.config import ModelSpec
from supervisor.systemd import child_environment
from supervisor.errors import (
    ContextOverflow,
    CorralError,
    InternalError,
    InvalidRequest,
    Unsupported,
    WorkerCrashed,
    WorkerUnavailable,
)
from worker.protocol import (
    Cancel,
    ChatMessage,
    Embed,
    EmbedResult,
    Error,
    Failed,
    FrameBuffer,
    Frame,
    Generate,
    Loading,
    Occupancy,
    Pong,
    ProtocolError,
    Ready,
    SamplingParams,
    Shutdown,
    Step,
    Tokenize,
    TokenizeResult,
    TokenEvent,
    WorkerSpec,
    decode_from_worker,
    encode,
)

log = logging.getLogger("corral.worker")


@dataclass(frozen=True)
class Gone:
    """Sentinel on a request channel: the worker is gone."""

    reason: str


Reply = Union[TokenEvent, Error, EmbedResult, TokenizeResult, Gone]

def _unavailable(message: str, param: str | None) -> CorralError:
    # A Generate that crossed the worker's Shutdown: a new worker will take it (503, retry).
    return WorkerUnavailable(message, retry=True, retry_after=1.0)


# The worker's error codes, as the errors that router/errors.py maps to HTTP.
WORKER_ERRORS: dict[str, Callable[[str, str | None], CorralError]] = {
    "context_length_exceeded": ContextOverflow,
    "invalid_request": InvalidRequest,
    "unsupported": Unsupported,
    "unavailable": _unavailable,
    "internal": InternalError,
}


class LoadFailed(Exception):
    pass


class RequestStream:
    """What the worker says about one request. Iterate for TokenEvents; errors raise.

    Leaving the stream before its final event (client gone, cancellation) must call
    `close()`, which tells the worker to stop generating; it never blocks.
    """

    def __init__(self, conn: WorkerConnection, rid: int, recv: trio.MemoryReceiveChannel[Reply]):
        self.conn, self.id, self._recv = conn, rid, recv
        self.finished = False

    async def receive(self) -> Reply:
        try:
            reply = await self._recv.receive()
        except trio.EndOfChannel:
            raise WorkerCrashed("the worker closed the request without an answer") from None
        if isinstance(reply, Gone):
            self.finished = True
            raise WorkerCrashed(f"the model's worker failed mid-request: {reply.reason}")
        if isinstance(reply, Error):
            self.finished = True
            raise WORKER_ERRORS.get(reply.code, InternalError)(reply.message, reply.param)
        if not isinstance(reply, TokenEvent) or reply.finish_reason is not None:
            self.finished = True
        return reply

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self.finished:
            raise StopAsyncIteration
        reply = await self.receive()
        assert isinstance(reply, TokenEvent)
        return reply

    def close(self) -> None:
        if not self.finished:
            self.finished = True
            self.conn.forget(self.id, cancel=True)


class WorkerConnection:
    def __init__(self, name: str, stream: trio.abc.Stream, on_close: Callable[[], None]):
        self.name = name
        self._stream = stream
        self._on_close = on_close
        self._ids = itertools.count(1)
        self._pending: dict[int, trio.MemorySendChannel[Reply]] = {}
        self._out_send, self._out_recv = trio.open_memory_channel[bytes](math.inf)
        self.ready: Ready | None = None
        self.ready_event = trio.Event()
        self.failed_message: str | None = None
        self.closed = trio.Event()
        self.close_reason = ""
        self.process: trio.Process | None = None
        self.last_pong = 0.0  # trio clock; Ready counts as the first answer
        self.stats: Pong | None = None  # the latest answer to a ping
        # Requests holding a slot, and waiting for one, as the worker last said (Occupancy
        # after every change, and every Pong).
        self.active = 0
        self.queued = 0

    # ---- requests -----------------------------------------------------------------------------

    def _open(self) -> tuple[int, trio.MemoryReceiveChannel[Reply]]:
        if self.closed.is_set():
            raise WorkerCrashed(f"the model's worker is gone: {self.close_reason}")
        rid = next(self._ids)
        send, recv = trio.open_memory_channel[Reply](math.inf)
        self._pending[rid] = send
        return rid, recv

    def generate(
        self,
        params: SamplingParams,
        prompt: str | None = None,
        messages: list[ChatMessage] | None = None,
    ) -> RequestStream:
        """Queue a generation; never blocks. Iterate the stream for its events."""
        rid, recv = self._open()
        self.send(Generate(id=rid, params=params, prompt=prompt, messages=messages))
        return RequestStream(self, rid, recv)

    async def embed(self, inputs: list[str]) -> EmbedResult:
        rid, recv = self._open()
        stream = RequestStream(self, rid, recv)
        self.send(Embed(id=rid, inputs=inputs))
        try:
            reply = await stream.receive()
        finally:
            stream.close()
        assert isinstance(reply, EmbedResult)
        return reply

    async def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        rid, recv = self._open()
        stream = RequestStream(self, rid, recv)
        self.send(Tokenize(id=rid, text=text, add_special=add_special))
        try:
            reply = await stream.receive()
        finally:
            stream.close()
        assert isinstance(reply, TokenizeResult)
        return reply.tokens

    def kill(self, reason: str) -> None:
        """Fail every request in flight with `reason`, then SIGKILL the worker (which works
        on a SIGSTOPped process too)."""
        self._close(reason)
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()

    def cancel_all(self, reason: str) -> None:
        """End every request in flight with WorkerCrashed(reason) and cancel it in the worker."""
        for rid, ch in list(self._pending.items()):
            _tell_gone(ch, reason)
            self.forget(rid, cancel=True)

    def forget(self, rid: int, cancel: bool) -> None:
        ch = self._pending.pop(rid, None)
        if ch is not None:
            ch.close()
            if cancel and not self.closed.is_set():
                self.send(Cancel(id=rid))

    def send(self, frame: Frame) -> None:
        """Queue a frame for the writer task; never blocks."""
        try:
            self._out_send.send_nowait(encode(frame))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise WorkerCrashed(f"the model's worker is gone: {self.close_reason}") from None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # ---- tasks --------------------------------------------------------------------------------

    async def writer(self) -> None:
        try:
            async for data in self._out_recv:
                await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._close(f"socket write failed: {exc}")

    async def reader(self) -> None:
        frames = FrameBuffer()
        reason = "the worker closed its socket"
        try:
            while True:
                data = await self._stream.receive_some(1 << 16)
                if not data:
                    break
                for body in frames.feed(data):
                    self._dispatch(decode_from_worker(body))
        except ProtocolError as exc:
            reason = f"protocol error: {exc}"
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            reason = f"socket error: {exc}"
        finally:
            self._close(reason)

    def _dispatch(self, frame: Frame) -> None:
        if isinstance(frame, Step):
            for ev in frame.events:
                self._deliver(ev.id, ev, final=ev.finish_reason is not None)
        elif isinstance(frame, (Error, EmbedResult, TokenizeResult)):
            self._deliver(frame.id, frame, final=True)
        elif isinstance(frame, Loading):
            pass  # progress is for the log of a slow load; nothing here shows it yet
        elif isinstance(frame, Ready):
            self.ready = frame
            self.last_pong = trio.current_time()
            self.ready_event.set()
        elif isinstance(frame, Failed):
            self.failed_message = frame.message
        elif isinstance(frame, Pong):
            self.last_pong = trio.current_time()
            self.stats = frame
            self.active, self.queued = frame.active, frame.queued
        elif isinstance(frame, Occupancy):
            self.active, self.queued = frame.active, frame.queued

    def _deliver(self, rid: int, reply: Reply, final: bool) -> None:
        ch = self._pending.get(rid)
        if ch is None:
            return  # the request was cancelled; its last events are expected and dropped
        try:
            ch.send_nowait(reply)
        except trio.BrokenResourceError:
            pass  # the consumer closed its end; Cancel is on its way
        if final:
            del self._pending[rid]
            ch.close()

    def _close(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.close_reason = reason
        self.closed.set()
        self._out_send.close()
        for ch in self._pending.values():
            _tell_gone(ch, reason)
            ch.close()
        self._pending.clear()
        self._on_close()


def _tell_gone(ch: trio.MemorySendChannel[Reply], reason: str) -> None:
    """The request's last reply: its worker is gone. A consumer that already left is fine."""
    with contextlib.suppress(trio.BrokenResourceError):
        ch.send_nowait(Gone(reason))


def worker_spec(spec: ModelSpec, threads: int | None = None) -> WorkerSpec:
    """What the worker needs to know of a model's config; `threads` overrides the
    config's (the supervisor's share of the cores when the config sets none)."""
    return WorkerSpec(
        name=spec.name,
        path=str(spec.path),
        slots=spec.slots,
        n_ctx=spec.n_ctx,
        n_batch=spec.n_batch,
        threads=threads if threads is not None else spec.threads,
        n_gpu_layers=spec.n_gpu_layers,
        chat_template=spec.chat_template,
        embeddings=spec.embeddings,
        pooling=spec.pooling,
        repack=spec.repack,
        swa_full=spec.swa_full,
    )


async def open_worker(
    nursery: trio.Nursery,
    spec: WorkerSpec,
    command: Sequence[str],
    on_close: Callable[[], None],
) -> WorkerConnection:
    """Spawn a worker in `nursery` and wait until it is Ready.

    Raises LoadFailed if the worker reports Failed or exits first. Cancellation (the caller's
    start timeout) kills the process: the nursery owns it.
    """
    parent, child = socket.socketpair()
    try:
        argv = [*command, "--fd", str(child.fileno()), "--spec", msgspec.json.encode(spec).decode()]
        process: trio.Process = await nursery.start(
            _run_process, argv, child.fileno()
        )
    finally:
        child.close()  # the worker holds its own copy; ours would hide its EOF
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(parent))
    conn = WorkerConnection(spec.name, stream, on_close)
    conn.process = process
    nursery.start_soon(conn.reader)
    nursery.start_soon(conn.writer)
    nursery.start_soon(_watch_exit, conn, process)
    await wait_until_ready(conn)
    if conn.ready is None:
        code = await _exit_code(process)
        raise LoadFailed(conn.failed_message or f"worker exited during load (exit code {code})")
    return conn


async def wait_until_ready(conn: WorkerConnection) -> None:
    """Return when the worker has sent Ready or its connection has closed, whichever is
    first; the caller tells them apart by `conn.ready`."""
    async with trio.open_nursery() as wait:

        async def until_ready() -> None:
            await conn.ready_event.wait()
            wait.cancel_scope.cancel()

        async def until_closed() -> None:
            await conn.closed.wait()
            wait.cancel_scope.cancel()

        wait.start_soon(until_ready)
        wait.start_soon(until_closed)


async def _run_process(
    argv: list[str], fd: int, *, task_status: trio.TaskStatus[trio.Process]
) -> None:
    # check=False: a worker's exit status is information for the handle, not an exception
    # that would tear down the nursery. stdin is closed so a worker never reads the terminal.
    await trio.run_process(
        argv,
        pass_fds=(fd,),
        stdin=subprocess.DEVNULL,
        check=False,
        env=child_environment(),  # only the main process may notify systemd
        task_status=task_status,
        deliver_cancel=_kill,
    )


async def _kill(process: trio.Process) -> None:
    """Cancellation kills outright: graceful stops happen before the nursery is cancelled."""
    with contextlib.suppress(ProcessLookupError):
        process.kill()


async def _watch_exit(conn: WorkerConnection, process: trio.Process) -> None:
    code = await process.wait()
    # EOF on the socket usually arrives first; this catches a worker whose socket a
    # grandchild still holds open.
    conn._close(f"worker exited with code {_describe(code)}")


async def _exit_code(process: trio.Process) -> str:
    with trio.move_on_after(2.0):
        return _describe(await process.wait())
    return "unknown"


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


async def stop_worker(conn: WorkerConnection, grace: float) -> None:
    """Ask the worker to finish and exit; SIGTERM, then SIGKILL if it will not.

    Shielded by the caller when it runs during cancellation.
    """
    process = conn.process
    if process is None or process.returncode is not None:
        return
    try:
        conn.send(Shutdown(grace=grace))
    except WorkerCrashed:
        pass
    with trio.move_on_after(grace + 1.0):
        await process.wait()
        return
    log.warning("%s: worker did not exit after Shutdown; sending SIGTERM", conn.name)
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    with trio.move_on_after(grace):
        await process.wait()
        return
    log.warning("%s: worker ignored SIGTERM; sending SIGKILL", conn.name)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()


def default_worker_command() -> list[str]:
    return [sys.executable, "-m", "worker"]


class Launcher(Protocol):
    """How a handle gets a worker. The supervisor uses ProcessLauncher; the lifecycle tests
    use an in-process one, so that timing logic runs under trio's virtual clock."""

    async def start(
        self, nursery: trio.Nursery, spec: WorkerSpec, on_close: Callable[[], None]
    ) -> WorkerConnection:
        """A Ready worker whose tasks live in `nursery`; raises LoadFailed."""
        ...

    async def stop(self, conn: WorkerConnection, grace: float) -> None:
        """Stop it gracefully, escalating as needed; return once it is gone."""
        ...


class ProcessLauncher:
    """Workers as child processes (`python -m worker`, or a test's fake worker)."""

    def __init__(self, command: Sequence[str] | None = None) -> None:
        self.command = list(command or default_worker_command())

    async def start(
        self, nursery: trio.Nursery, spec: WorkerSpec, on_close: Callable[[], None]
    ) -> WorkerConnection:
        return await open_worker(nursery, spec, self.command, on_close)

    async def stop(self, conn: WorkerConnection, grace: float) -> None:
        await stop_worker(conn, grace)
