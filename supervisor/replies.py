"""What a worker answers to one request, as the request's channel carries it, and the
worker's error codes as the CorralErrors that router/server/errors.py maps to HTTP.

A request's channel carries the worker's frames for it, then `Gone` if the worker died
first; `answer` turns either ending into an exception, so a caller handles one thing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, TypeVar, Union

import trio

from supervisor.errors import (
    ContextOverflow,
    CorralError,
    InsufficientStorage,
    InternalError,
    InvalidRequest,
    Unsupported,
    WorkerCrashed,
    WorkerUnavailable,
)
from worker.protocol import (
    DetokenizeResult,
    EmbedResult,
    Error,
    Rendered,
    SlotsResult,
    SlotFileResult,
    TokenEvent,
    TokenizeResult,
)


@dataclass(frozen=True)
class Gone:
    """Sentinel on a request channel: the worker is gone."""

    reason: str


Reply = Union[
    TokenEvent, Error, EmbedResult, TokenizeResult, DetokenizeResult, Rendered, SlotsResult, SlotFileResult, Gone
]


def _unavailable(message: str, param: str | None) -> CorralError:
    # A Generate that crossed the worker's Shutdown: a new worker will take it (503, retry).
    return WorkerUnavailable(message, retry=True, retry_after=1.0)


# The worker's error codes, as the errors that router/server/errors.py maps to HTTP.
WORKER_ERRORS: dict[str, Callable[[str, str | None], CorralError]] = {
    "context_length_exceeded": ContextOverflow,
    "invalid_request": InvalidRequest,
    "unsupported": Unsupported,
    "unavailable": _unavailable,
    "insufficient_storage": InsufficientStorage,
    "internal": InternalError,
}


async def answer(recv: trio.MemoryReceiveChannel[Reply]) -> Reply:
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


_T = TypeVar("_T")


def expect(reply: Reply, kind: type[_T]) -> _T:
    """`reply` as the answer its request expects; another frame is a worker's bug."""
    if not isinstance(reply, kind):
        raise InternalError(f"the worker answered with {type(reply).__name__}, expected {kind.__name__}")
    return reply


def tell_gone(ch: trio.MemorySendChannel[Reply], reason: str) -> None:
    """The request's last reply: its worker is gone. A consumer that already left is fine."""
    with contextlib.suppress(trio.BrokenResourceError):
        ch.send_nowait(Gone(reason))
