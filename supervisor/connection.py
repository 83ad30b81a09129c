"""The frame connection to one worker (supervisor/launcher.py starts and stops the process).

Many requests share the connection: each gets an unbounded channel keyed by request id, so
a slow client never stalls the reader for everyone else.

When the worker dies or breaks the protocol, every request in flight gets WorkerCrashed at
once, and `closed` is set.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, TypeVar, Union

import trio

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
    Detokenize,
    DetokenizeResult,
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
    Render,
    Rendered,
    SamplingParams,
    SlotsQuery,
    SlotsResult,
    SlotState,
    Step,
    Tokenize,
    TokenizeResult,
    TokenEvent,
    decode_from_worker,
    encode,
)

log = logging.getLogger("corral.worker")


@dataclass(frozen=True)
class Gone:
    """Sentinel on a request channel: the worker is gone."""

    reason: str


Reply = Union[TokenEvent, Error, EmbedResult, TokenizeResult, DetokenizeResult, Rendered, SlotsResult, Gone]


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


async def _answer(recv: trio.MemoryReceiveChannel[Reply]) -> Reply:
    """The worker's next answer to one request; its errors raise as CorralErrors."""
    try:
        reply = await recv.receive()
    except trio.EndOfChannel:
        raise WorkerCrashed("the worker closed the request without an answer") from None
    if isinstance(reply, Gone):
        raise WorkerCrashed(f"the model's worker failed mid-request: {reply.reason}")
    if isinstance(reply, Error):
        if reply.code == "context_length_exceeded":
            raise ContextOverflow(reply.message, reply.param, reply.n_prompt_tokens, reply.n_ctx)
        raise WORKER_ERRORS.get(reply.code, InternalError)(reply.message, reply.param)
    return reply


class RequestStream:
    """One generation's tokens, as the worker sends them; errors raise.

    A generation of `n` choices ends with the last of their n final events (each choice's
    events say its `index`). Leaving the stream before then (client gone, cancellation)
    must call `close()`, which tells the worker to stop generating every choice; it never
    blocks.
    """

    def __init__(self, conn: WorkerConnection, rid: int, recv: trio.MemoryReceiveChannel[Reply], n: int = 1):
        self.conn, self.id, self._recv = conn, rid, recv
        self.finished = False
        self._running = n  # choices without their final event yet

    async def receive(self) -> TokenEvent:
        """The next event; the last choice's event with a finish_reason is the last."""
        try:
            reply = await _answer(self._recv)
        except CorralError:
            self.finished = True
            raise
        if not isinstance(reply, TokenEvent):
            self.finished = True
            raise InternalError(f"the worker answered a generation with {type(reply).__name__}")
        if reply.finish_reason is not None:
            self._running -= 1
            self.finished = self._running <= 0
        return reply

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self.finished:
            raise StopAsyncIteration
        return await self.receive()

    def close(self) -> None:
        if not self.finished:
            self.finished = True
            self.conn.forget(self.id, cancel=True)

    def cancel_choice(self, index: int) -> None:
        """Stop choice `index` in the worker and go on reading: its final event comes
        (finish_reason "cancelled", with its usage), as do the other choices' events.
        Never blocks."""
        if not self.finished and not self.conn.closed.is_set():
            self.conn.send(Cancel(id=self.id, index=index))


class WorkerConnection:
    def __init__(
        self, name: str, stream: trio.abc.Stream, on_close: Callable[[], None],
        on_progress: Callable[[float], None] | None = None,
    ):
        self.name = name
        self._stream = stream
        self._on_close = on_close
        self._on_progress = on_progress  # each Loading frame's progress, while loading
        self._ids = itertools.count(1)
        self._pending: dict[int, trio.MemorySendChannel[Reply]] = {}
        self._choices: dict[int, int] = {}  # a generation's choices still running
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
        # Tokens generated by this worker, counted as each step arrives (cancelled
        # requests' last tokens too: the worker spent them), so that a rate taken between
        # two readings is live rather than counted when requests end.
        self.tokens_generated = 0

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
        prompt_parts: list[int | str] | None = None,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        prompt_tokens: list[int] | None = None,
        n: int = 1,
        echo: bool = False,
        request_id: str | None = None,
    ) -> RequestStream:
        """Queue a generation of `n` choices; never blocks. Iterate the stream for its
        events."""
        rid, recv = self._open()
        self._choices[rid] = n
        self.send(
            Generate(
                id=rid, params=params, prompt=prompt, messages=messages, prompt_parts=prompt_parts,
                tools=tools, template_kwargs=template_kwargs, prompt_tokens=prompt_tokens, n=n, echo=echo,
                request_id=request_id,
            )
        )
        return RequestStream(self, rid, recv, n)

    async def embed(self, inputs: list[str], tokens: list[list[int]] | None = None) -> EmbedResult:
        """Embed texts, or token arrays (`tokens`, with `inputs` empty)."""
        reply = await self._call(lambda rid: Embed(id=rid, inputs=inputs, tokens=tokens))
        assert isinstance(reply, EmbedResult)
        return reply

    async def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        reply = await self._call(lambda rid: Tokenize(id=rid, text=text, add_special=add_special))
        assert isinstance(reply, TokenizeResult)
        return reply.tokens

    async def tokenize_pieces(
        self, text: str, add_special: bool, parse_special: bool, with_pieces: bool
    ) -> TokenizeResult:
        """llama-server's /tokenize: the tokens, and each one's text when asked."""
        reply = await self._call(
            lambda rid: Tokenize(
                id=rid, text=text, add_special=add_special, parse_special=parse_special, with_pieces=with_pieces
            )
        )
        return _expect(reply, TokenizeResult)

    async def detokenize(self, tokens: list[int]) -> str:
        reply = await self._call(lambda rid: Detokenize(id=rid, tokens=tokens))
        return _expect(reply, DetokenizeResult).content

    async def render(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The messages rendered by the model's chat template, generation prompt included,
        as a chat request with these tools and template variables would have them."""
        reply = await self._call(
            lambda rid: Render(id=rid, messages=messages, tools=tools, template_kwargs=template_kwargs)
        )
        return _expect(reply, Rendered).prompt

    async def slots(self) -> list[SlotState]:
        reply = await self._call(lambda rid: SlotsQuery(id=rid))
        return _expect(reply, SlotsResult).slots

    async def _call(self, frame: Callable[[int], Frame]) -> Reply:
        """Send one request that has a single answer, and wait for it."""
        rid, recv = self._open()
        self.send(frame(rid))
        try:
            return await _answer(recv)
        finally:
            self.forget(rid, cancel=True)

    def kill(self, reason: str) -> None:
        """Fail every request in flight with `reason`, then SIGKILL the worker (which works
        on a SIGSTOPped process too)."""
        self.close(reason)
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
        self._choices.pop(rid, None)
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
            self.close(f"socket write failed: {exc}")

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
            self.close(reason)

    def _dispatch(self, frame: Frame) -> None:
        if isinstance(frame, Step):
            for ev in frame.events:
                self.tokens_generated += len(ev.tokens)
                self._deliver(ev.id, ev, final=ev.finish_reason is not None and self._last_choice(ev.id))
        elif isinstance(frame, (Error, EmbedResult, TokenizeResult, DetokenizeResult, Rendered, SlotsResult)):
            self._deliver(frame.id, frame, final=True)
        elif isinstance(frame, Loading):
            if self._on_progress is not None:
                self._on_progress(frame.progress)
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

    def _last_choice(self, rid: int) -> bool:
        """A choice of `rid` finished: was it the last one running?"""
        left = self._choices.get(rid, 1) - 1
        if left > 0:
            self._choices[rid] = left
            return False
        self._choices.pop(rid, None)
        return True

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
            self._choices.pop(rid, None)
            ch.close()

    def close(self, reason: str) -> None:
        """Mark the worker gone: every request in flight ends with WorkerCrashed(reason), and
        nothing more is sent. The process is not touched (see `kill`)."""
        if self.closed.is_set():
            return
        self.close_reason = reason
        self.closed.set()
        self._out_send.close()
        for ch in self._pending.values():
            _tell_gone(ch, reason)
            ch.close()
        self._pending.clear()
        self._choices.clear()
        self._on_close()


_T = TypeVar("_T")


def _expect(reply: Reply, kind: type[_T]) -> _T:
    """`reply` as the answer its request expects; another frame is a worker's bug."""
    if not isinstance(reply, kind):
        raise InternalError(f"the worker answered with {type(reply).__name__}, expected {kind.__name__}")
    return reply


def _tell_gone(ch: trio.MemorySendChannel[Reply], reason: str) -> None:
    """The request's last reply: its worker is gone. A consumer that already left is fine."""
    with contextlib.suppress(trio.BrokenResourceError):
        ch.send_nowait(Gone(reason))
