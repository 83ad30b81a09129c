"""A model's slots, handed out in turn (supervisor/slot_order.py), with a bounded wait.

Without it every request went straight to the worker, which queued it without limit: under
overload, requests piled up and each waited longer than the last, until clients timed out
with nothing to tell them when to come back. Now a request takes its slots here before it
reaches the worker (a choice per slot: `n` choices of `p` prompts take `n × p`, at most
all of them):

- with enough slots free and nobody ahead, at once;
- otherwise it waits in line for its turn: by class, then fair shares between keys, then
  arrival (supervisor/slot_order.py; with one class and one key, arrival order). The
  request whose turn it is is served next even if it needs more slots than are free:
  nothing overtakes it meanwhile;
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
A request handed ahead is served before any that arrives later, whatever their classes, so
a request of a class below one seen lately waits here instead (SlotOrder.may_run_ahead):
with one class, as on a server without keys, the lookahead is what it was; with several,
only the first request of a better class after ten quiet minutes can find requests of a
lower one handed ahead of it (one per slot at most).

A request does not wait for the slots a worse class holds: it is granted as if they were
free, and the worker takes one back for it, parking the newest request of the worst class
running (its cells kept; it resumes where it stopped: worker/priority.py). `busy` may then
exceed the slots, by at most the slots again for each better class.

Turns are decided when something changes (a request comes or leaves, slots are given back,
the worker's slot count changes): aging that would let a request run ahead meanwhile waits
for the next such change, which costs that request the step the lookahead saves, no more.

The estimate is deliberately simple: the line ahead (those waiting, and those already told
to come back later), divided among the slots, times the average hold. Refused clients are
thus told successive times, and come back one after another rather than as a herd.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import trio

from supervisor.config.key_rules import RANKS
from supervisor.errors import Overloaded, WorkerUnavailable
from supervisor.slot_order import AGING, Place, SlotOrder, Waiting

# Weight of the newest hold in the running average: about the last 5 requests count.
_SMOOTHING = 0.2
# Before any request has finished, a hold is assumed to take this long.
_FIRST_GUESS = 1.0
RETRY_AFTER_MAX = 60.0


@dataclass(eq=False)
class _Waiter:
    turn: Waiting  # its place in the order
    granted: trio.Event = field(default_factory=trio.Event)
    ticket: Ticket | None = None


class SlotQueue:
    def __init__(self, name: str, aging: float = AGING) -> None:
        self.name = name
        self.capacity = 0  # the running worker's slots (0: none known yet)
        self.busy = 0
        self._order = SlotOrder(aging)
        self._line: dict[Waiting, _Waiter] = {}
        # Tickets not yet given back, in the order granted: the worker starts them in that
        # order, so those still waiting in it are the last ones (waiting_by_rank).
        self._held: dict[Ticket, None] = {}
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

    def waiting_by_rank(self) -> dict[int, int]:
        """The requests of `waiting`, by their class's rank: those in line here, and the
        last granted as far as the worker holds them ahead of its slots."""
        out = self._order.waiting_by_rank()
        ahead = self.busy - self.capacity
        # The worker holds back the worst class first (it parks those), then the last granted.
        held = list(self._held)
        for _, t in sorted(enumerate(held), key=lambda it: (it[1].rank, it[0]), reverse=True):
            if ahead <= 0:
                break
            out[t.rank] = out.get(t.rank, 0) + 1
            ahead -= t.slots
        return out

    def waiting_by_class(self) -> dict[str, int]:
        """waiting_by_rank() under the classes' names, every class named (GET /admin/models)."""
        by_rank = self.waiting_by_rank()
        return {name: by_rank.get(rank, 0) for name, rank in RANKS.items()}

    @property
    def _slots(self) -> int:
        """The worker's slots (1 until its Ready says)."""
        return max(self.capacity, 1)

    def _need(self, w: Waiting) -> int:
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

    async def take(
        self, slots: int, max_queue: int | None, timeout: float, place: Place = Place()
    ) -> Ticket:
        """`slots` slots (at most the capacity), held until the ticket is released, in the
        turn `place` gives (the default, a normal class and no key: arrival order).
        `max_queue` None: no bound; `timeout` 0: wait as long as it takes. Raises
        Overloaded or WorkerUnavailable."""
        lookahead = 0 if timeout else min(self._slots, max_queue if max_queue is not None else math.inf)
        if lookahead != self.lookahead:
            self.lookahead = int(lookahead)
            self._admit()
        me = _Waiter(self._order.add(place, max(1, slots), trio.current_time()))
        self._line[me.turn] = me
        self._admit()  # at once if its turn has come and its slots are free
        if me.ticket is not None:
            return me.ticket
        if max_queue is not None and self.waiting - 1 >= max_queue:
            self._leave(me)
            raise Overloaded(
                f"model {self.name!r} is at capacity: {min(self.busy, self.capacity)} of {self.capacity} "
                f"slot(s) busy and {self.waiting} request(s) waiting (max_queue = {max_queue}); retry later",
                retry_after=self._refusal_wait(),
            )
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
        del self._line[w.turn]
        self._order.leave(w.turn)
        self._admit()  # the one behind may fit where this one did not

    def _fits(self, w: Waiting, now: float) -> bool:
        # the worker's slots, and the lookahead where this request may take it
        ahead = self.lookahead if self._order.may_run_ahead(w, now) else 0
        # Slots held by a worse class do not count against it: the worker parks such a
        # request to start this one (worker/priority.py), so it need not wait for them.
        rank = self._rank(w, now)
        held = self.busy if rank == max(RANKS.values()) else sum(t.slots for t in self._held if t.rank <= rank)
        return held + self._need(w) <= self._slots + ahead

    def _rank(self, w: Waiting, now: float) -> int:
        """The class `w` is granted in: its own, or better once it has aged (never better
        than the best class: an aged request is not parked by a fresh interactive one, and
        parks no interactive one itself)."""
        return max(0, self._order.class_of(w, now))

    def _grant(self, w: _Waiter, now: float) -> None:
        n = self._need(w.turn)
        rank = self._rank(w.turn, now)  # while its flow's wait still counts
        self.busy += n
        self._order.served(w.turn, n, now)
        w.ticket = Ticket(self, n, rank)
        self._held[w.ticket] = None
        w.granted.set()

    def _admit(self) -> None:
        """Grant slots to the request whose turn it is, while they fit; while they do not,
        nobody else's turn comes."""
        now = trio.current_time()
        while (turn := self._order.next(now)) is not None and self._fits(turn, now):
            self._grant(self._line.pop(turn), now)

    def _give_back(self, ticket: Ticket, held: float) -> None:
        self.busy -= ticket.slots
        del self._held[ticket]
        self.mean_hold += _SMOOTHING * (held - self.mean_hold)
        self._admit()


class Ticket:
    """A request's slots. `release()` is idempotent and never blocks."""

    def __init__(self, queue: SlotQueue, slots: int, rank: int) -> None:
        self._queue: SlotQueue | None = queue
        self.slots = slots
        self.rank = rank  # the class it was granted in (Generate.priority; waiting_by_rank)
        self._since = trio.current_time()

    def release(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue._give_back(self, trio.current_time() - self._since)
