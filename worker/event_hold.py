"""Holding back the token events of a request whose client reads its answer whole.

A non-streaming client gets nothing before the answer is complete, yet each of its tokens
would cross two processes as it was sampled: a frame from the engine thread to the
worker's event loop, a socket write, and a wakeup of the router's loop. On a machine whose
cores all decode, those wakeups take the cores from llama.cpp's threads at every step
(measured: one non-streaming stream at 0.93x llama-server's tok/s with them, 0.98x
without; bench/throughput.py). So such a request (Generate.hold_events) sends its first
event at once (the router answers errors and counts time to first token from it), and the
rest with its final one, in the same order, in one frame.

Only events are held. An Error for a held request drops what was held (the router answers
the error, never a partial text), and so does a Cancel of the whole request (the router no
longer reads it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from worker.protocol import Error, Frame, Step, TokenEvent

Emit = Callable[[Frame], None]


@dataclass
class _Held:
    choices: int  # n: each choice ends with its own final event
    started: set[int] = field(default_factory=set)  # choices whose first event went out
    events: dict[int, list[TokenEvent]] = field(default_factory=dict)
    ended: int = 0


class EventHold:
    """Wraps the worker's emit. `hold` is called from the link's thread as a Generate
    arrives, the wrapper from the engine's and the preparers', hence the lock."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}

    def hold(self, rid: int, n: int) -> None:
        with self._lock:
            self._held[rid] = _Held(choices=max(1, n))

    def drop(self, rid: int) -> None:
        """Forget `rid` and what it held (it was cancelled)."""
        with self._lock:
            self._held.pop(rid, None)

    def holds(self, rid: int) -> bool:
        """Whether `rid`'s events wait for its end."""
        with self._lock:
            return rid in self._held

    @property
    def holding(self) -> int:
        """Requests being held (tests: none is left behind)."""
        with self._lock:
            return len(self._held)

    def __call__(self, frame: Frame) -> None:
        if isinstance(frame, Step):
            with self._lock:
                events = self._route(frame.events)
            if events:
                self._emit(Step(events=events))
            return
        if isinstance(frame, Error):
            self.drop(frame.id)
        self._emit(frame)

    def _route(self, events: list[TokenEvent]) -> list[TokenEvent]:
        """The events to send now, in order; holds the rest. Called under the lock."""
        out: list[TokenEvent] = []
        for ev in events:
            h = self._held.get(ev.id)
            if h is None:
                out.append(ev)
                continue
            if ev.finish_reason is not None:
                out += h.events.pop(ev.index, [])
                out.append(ev)
                h.started.add(ev.index)
                h.ended += 1
                if h.ended >= h.choices:
                    del self._held[ev.id]
            elif ev.index not in h.started:
                h.started.add(ev.index)
                out.append(ev)
            else:
                h.events.setdefault(ev.index, []).append(ev)
        return out
