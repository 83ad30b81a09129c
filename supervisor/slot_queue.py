"""A model's slots, handed out first come, first served, with a bounded wait.

Without it every request went straight to the worker, which queued it without limit: under
overload, requests piled up and each waited longer than the last, until clients timed out
with nothing to tell them when to come back. Now a request takes its slots here before it
reaches the worker (a choice per slot: `n` choices of `p` prompts take `n × p`, at most
all of them):

- with enough slots free and nobody ahead, at once;
- otherwise it waits in line, in arrival order: a request never overtakes one that came
  before it, even one that needs more slots;
- with `max_queue` requests already waiting, it is refused at once: Overloaded (429), with
  a Retry-After estimated from how long this model's requests have held their slots
  lately;
- after `queue_timeout` seconds in line, it gives up: 503, with the same estimate.

Without a queue_timeout, up to one request per slot waits inside the worker instead of
here (`lookahead`, counted in `waiting` and against max_queue like the rest): the worker
prepares it (template, tokens) while the slot is still busy and starts it at the very step
the slot frees. Held here, a short request's slot stood idle for a step or more each time
(3% of throughput for 8 clients of 4-token completions on 4 slots, bench/overhead.py). With
a queue_timeout every waiting request stays here, where the timeout can end its wait.

The estimate is deliberately simple: the line ahead (those waiting, and those already told
to come back later), divided among the slots, times the average hold. Refused clients are
thus told successive times, and come back one after another rather than as a herd.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import trio

from supervisor.errors import Overloaded, WorkerUnavailable

# Weight of the newest hold in the running average: about the last 5 requests count.
_SMOOTHING = 0.2
# Before any request has finished, a hold is assumed to take this long.
_FIRST_GUESS = 1.0
RETRY_AFTER_MAX = 60.0


@dataclass(eq=False)
class _Waiter:
    slots: int
    granted: trio.Event = field(default_factory=trio.Event)
    ticket: Ticket | None = None


class SlotQueue:
    def __init__(self, name: str) -> None:
        self.name = name
        self.capacity = 0  # the running worker's slots (0: none known yet)
        self.busy = 0
        self._line: deque[_Waiter] = deque()
        self.mean_hold = _FIRST_GUESS
        self.lookahead = 0  # requests the worker may hold beyond its slots (see above)
        # When refused clients were told to come back, oldest first (each later than the
        # last, but for a change in mean_hold, which only blurs the count a little).
        self._promised: deque[float] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot: in line here, or handed to the worker ahead of a
        free slot (slots, for requests of several choices)."""
        return len(self._line) + max(0, self.busy - self.capacity)

    @property
    def _slots(self) -> int:
        """The worker's slots (1 until its Ready says)."""
        return max(self.capacity, 1)

    def _need(self, w: _Waiter) -> int:
        """What a waiter takes: its slots, at most all of the worker's."""
        return min(w.slots, self._slots)

    def retry_after(self) -> float:
        """Seconds until a request arriving now could expect a slot: the requests in line
        and those told to come back before then are ahead of it."""
        now = trio.current_time()
        while self._promised and self._promised[0] <= now:
            self._promised.popleft()  # amortised O(1): a flood of refusals stays cheap
        ahead = self.waiting + len(self._promised) + 1
        rounds = math.ceil(ahead / self._slots)
        return min(max(self.mean_hold * rounds, 1.0), RETRY_AFTER_MAX)

    def _refusal_wait(self) -> float:
        """retry_after(), promised to a refused client: the next one refused is told a
        later time, so that refused clients come back one after another instead of all
        at once (the openai clients wait exactly as told)."""
        wait = self.retry_after()
        if wait < RETRY_AFTER_MAX:  # past the horizon, every client hears the same
            self._promised.append(trio.current_time() + wait)
        return wait

    def resize(self, capacity: int) -> None:
        """The worker's slot count (it can change with a restart)."""
        if capacity != self.capacity:
            self.capacity = capacity
            self._admit()

    async def take(self, slots: int, max_queue: int | None, timeout: float) -> Ticket:
        """`slots` slots (at most the capacity), held until the ticket is released.
        `max_queue` None: no bound; `timeout` 0: wait as long as it takes. Raises
        Overloaded or WorkerUnavailable."""
        me = _Waiter(max(1, slots))
        lookahead = 0 if timeout else min(self._slots, max_queue if max_queue is not None else math.inf)
        if lookahead != self.lookahead:
            self.lookahead = int(lookahead)
            self._admit()
        if not self._line and self._fits(me):
            return self._grant(me)
        if max_queue is not None and self.waiting >= max_queue:
            raise Overloaded(
                f"model {self.name!r} is at capacity: {min(self.busy, self.capacity)} of {self.capacity} "
                f"slot(s) busy and {self.waiting} request(s) waiting (max_queue = {max_queue}); retry later",
                retry_after=self._refusal_wait(),
            )
        self._line.append(me)
        try:
            with trio.move_on_after(timeout or math.inf):
                await me.granted.wait()
        except BaseException:  # the client left: granted meanwhile or not, nothing is kept
            if me.ticket is not None:
                me.ticket.release()
            else:
                self._leave(me)
            raise
        if me.ticket is not None:
            return me.ticket
        self._leave(me)
        raise WorkerUnavailable(
            f"model {self.name!r} had no free slot within queue_timeout = {timeout:g}s",
            retry_after=self._refusal_wait(),
        )

    def _leave(self, w: _Waiter) -> None:
        self._line.remove(w)
        self._admit()  # the one behind may fit where this one did not

    def _fits(self, w: _Waiter) -> bool:
        # the worker's slots, and the lookahead
        return self.busy + self._need(w) <= self._slots + self.lookahead

    def _grant(self, w: _Waiter) -> Ticket:
        n = self._need(w)
        self.busy += n
        w.ticket = Ticket(self, n)
        w.granted.set()
        return w.ticket

    def _admit(self) -> None:
        """Grant slots to the line's head while they fit: in arrival order, always."""
        while self._line and self._fits(self._line[0]):
            self._grant(self._line.popleft())

    def _give_back(self, slots: int, held: float) -> None:
        self.busy -= slots
        self.mean_hold += _SMOOTHING * (held - self.mean_hold)
        self._admit()


class Ticket:
    """A request's slots. `release()` is idempotent and never blocks."""

    def __init__(self, queue: SlotQueue, slots: int) -> None:
        self._queue: SlotQueue | None = queue
        self.slots = slots
        self._since = trio.current_time()

    def release(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue._give_back(self.slots, trio.current_time() - self._since)
