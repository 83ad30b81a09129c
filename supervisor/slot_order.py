"""Which waiting request a model's slots serve next: priority classes, fair shares between
keys, and aging (issue 44).

Pure: plain data, with the clock's reading passed in; supervisor/slot_queue.py performs
the choices. The rules, each breaking the ties of the one before:

1. **Class.** A request stands in its key's class (supervisor/config/key_rules.py), rank 0
   "interactive" ahead of 1 "normal" ahead of 2 "batch", as vLLM serves a lower `priority`
   first.
2. **Aging.** An owner's requests of one class form a flow, served oldest first. A flow that
   has gone `aging` seconds without a grant (since its oldest request came, or since its
   last grant) moves up a class, and another each `aging` seconds after, past "interactive"
   if need be, so nothing waits forever: after (rank + 1) × aging seconds without a grant, a
   flow is ahead of every flow that arrives or is served later, and is served once each
   flow already waiting then has had a grant at most. The clock is the flow's, not each
   request's: requests aging one by one, an owner's fifty old requests would rise as a
   block and pass its class's other owners fifty times, which rule 3 forbids.
3. **Fair shares.** Within a class, the owner granted the fewest slots so far goes first
   (the virtual token counter of Sheng et al., "Fairness in Serving Large Language
   Models", OSDI 2024, in slots). A key with fifty requests waiting does not make a key with
   one wait behind all fifty: that one waits for a grant to each owner already waiting at
   most, and two owners that both keep waiting are never more than one request's slots
   apart. An owner that starts waiting is lifted to the fewest slots among its class's
   waiting owners, so that time spent idle is no credit to spend on a burst later; and
   the counts start again whenever nobody waits (with no one kept waiting, there is no
   debt to settle). Slots, not slot-seconds: how long a request will hold its slots is not
   known when it is chosen, and a key's tokens are its quotas' business.
4. **Arrival.** Then the oldest request first.

The request chosen is served next, whatever its size: while its slots are not free nothing
is granted, so a request of several slots is never starved by small ones slipping past it
(the line's rule before classes: a request never overtakes one chosen before it).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

# Seconds a flow goes without a grant before it moves up a class. Longer than an
# interactive exchange (an answer of a few hundred tokens takes 5 to 30 s on a CPU), so
# that a burst of interactive traffic does keep "batch" out; short enough that even a
# "batch" flow overtakes everything newer within three minutes, well inside the openai
# clients' 600 s timeout.
AGING = 60.0
# A class whose request arrived this recently is expected again: a request of a lower
# class is not handed to the worker ahead of a free slot (may_run_ahead), where a request
# of that class arriving meanwhile could no longer pass it. Ten minutes: longer than a
# person's pause between two questions. The trade is lopsided: running ahead saves a
# request one decode step, while a better request arriving behind it waits a whole
# generation more, so the lookahead goes only where no better class is expected.
SEEN_LATELY = 600.0

INTERACTIVE, NORMAL, BATCH = 0, 1, 2
ANONYMOUS = ""  # the owner of requests sent with no key


@dataclass(frozen=True)
class Place:
    """Where a request stands in the line: its class's rank and who sent it (a key's owner,
    supervisor/config/keys.py)."""

    rank: int = NORMAL
    owner: str = ANONYMOUS


@dataclass(eq=False)
class Waiting:
    """One request in line: `slots` is what it asked for (the queue caps it at the worker's
    slots); `seq` orders arrivals at the same instant."""

    place: Place
    slots: int
    arrival: float
    seq: int


@dataclass(eq=False)
class Flow:
    """One owner's requests of one class, oldest first; `since`: its last grant, or its
    first request's arrival (aging counts from it)."""

    place: Place
    since: float
    line: deque[Waiting] = field(default_factory=deque)


def effective_class(rank: int, waited: float, aging: float) -> int:
    """A flow's class after `waited` seconds without a grant: up one per `aging` seconds,
    without bound (aging 0 or infinite: never)."""
    if aging <= 0 or math.isinf(aging):
        return rank
    return rank - math.floor(max(waited, 0.0) / aging)


def choose(flows: list[Flow], granted: dict[str, int], now: float, aging: float) -> Flow | None:
    """The flow whose oldest request is served next: the best class after aging, then the
    owner granted the fewest slots, then the oldest request (None: nobody waits)."""
    def turn(f: Flow) -> tuple[int, int, int]:
        return effective_class(f.place.rank, now - f.since, aging), granted.get(f.place.owner, 0), f.line[0].seq

    return min(flows, key=turn, default=None)


class SlotOrder:
    """The requests waiting for one model's slots, and what deciding among them needs to
    remember: each flow's last grant, each owner's slots granted, each class's last
    arrival."""

    def __init__(self, aging: float = AGING) -> None:
        self.aging = aging
        self._flows: dict[Place, Flow] = {}
        self._granted: dict[str, int] = {}  # slots granted per owner since nobody waited
        self._seen: dict[int, float] = {}  # each rank's latest arrival
        self._seq = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, place: Place, slots: int, now: float) -> Waiting:
        """A request joins the line."""
        flow = self._flows.get(place)
        if flow is None:
            peers = [self._granted.get(f.place.owner, 0) for f in self._flows.values() if f.place.rank == place.rank]
            if peers:  # no credit for time spent idle
                self._granted[place.owner] = max(self._granted.get(place.owner, 0), min(peers))
            flow = self._flows[place] = Flow(place, now)
        self._seq += 1
        w = Waiting(place, slots, now, self._seq)
        flow.line.append(w)
        self._count += 1
        self._seen[place.rank] = max(now, self._seen.get(place.rank, now))
        return w

    def next(self, now: float) -> Waiting | None:
        """The request to serve next, left in line until `served`."""
        flow = choose(list(self._flows.values()), self._granted, now, self.aging)
        return flow.line[0] if flow is not None else None

    def served(self, w: Waiting, slots: int, now: float) -> None:
        """`w` was granted `slots` (at most what it asked): it leaves the line, its owner's
        count grows, and its flow's wait starts again."""
        self._remove(w)
        self._granted[w.place.owner] = self._granted.get(w.place.owner, 0) + slots
        if (flow := self._flows.get(w.place)) is not None:
            flow.since = now
        self._settle()

    def leave(self, w: Waiting) -> None:
        """`w` left the line unserved (its client gave up, or it was refused)."""
        self._remove(w)
        self._settle()

    def class_of(self, w: Waiting, now: float) -> int:
        """The class `w` stands in now (its flow's, after aging)."""
        flow = self._flows[w.place]
        return effective_class(flow.place.rank, now - flow.since, self.aging)

    def may_run_ahead(self, w: Waiting, now: float) -> bool:
        """Whether `w` may be handed to the worker ahead of a free slot: no better class
        has sent a request within SEEN_LATELY. The worker starts what it holds in the order
        given, so a request handed ahead is served before any that arrives later, whatever
        its class; where no better class is about, that costs nothing and saves the step a
        slot would stand idle."""
        c = self.class_of(w, now)
        return all(now - at >= SEEN_LATELY for rank, at in self._seen.items() if rank < c)

    def waiting_by_rank(self) -> dict[int, int]:
        """Requests in line, by their class's rank (before aging)."""
        out: dict[int, int] = {}
        for f in self._flows.values():
            out[f.place.rank] = out.get(f.place.rank, 0) + len(f.line)
        return out

    def _remove(self, w: Waiting) -> None:
        flow = self._flows[w.place]
        flow.line.remove(w)  # the head, but for a client that left: O(its flow)
        self._count -= 1
        if not flow.line:
            del self._flows[w.place]

    def _settle(self) -> None:
        if not self._count:
            self._granted.clear()  # a new busy period: nobody is owed anything
