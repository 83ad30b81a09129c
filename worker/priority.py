"""Priorities inside the worker: where a request joins the waiting line, and which running
request gives up its slot to a waiting one of a better class. Pure: plain numbers in,
an index out; the engine performs it (worker/kv_room.py, `park`).

Classes are ranks, lower served first (Generate.priority). The router's slot line orders
the requests it holds (supervisor/slot_queue.py); this is the same order for those that
reached the worker, and the one thing only the worker can do: take a slot back.

- The waiting line is by rank, then by arrival; a request taken off its slot goes back to
  the front of its rank, ahead of those that never started.
- A waiting request with no idle slot for it takes the slot of a running request of a
  worse rank: the worst rank first, then the newest admitted (the one the line would have
  served last, and so the one a strict order would have kept waiting). Its cells are
  parked, not dropped, so that it resumes where it stopped without decoding again.
- Never parked: a request that shares cells it does not own yet (a sibling following its
  leader's prompt, one waiting to copy a prefix another is decoding), and one whose images
  are still going in. Nor for a request of the same rank: within a class, nobody is
  preempted, so fair shares never cost a parked stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, TypeVar

from worker.slots import Slot


@dataclass(frozen=True)
class Running:
    rank: int
    admitted: float  # when it took a slot (first time): later is newer
    parkable: bool


def insert_at(ranks: Sequence[int], rank: int, front: bool) -> int:
    """Where a request of `rank` joins a line whose ranks are `ranks` (sorted, lowest
    first): after every request of its rank or better, or (`front`) before the others of
    its rank."""
    for i, r in enumerate(ranks):
        if r > rank or (front and r == rank):
            return i
    return len(ranks)


def victim(running: Sequence[Running | None], rank: int) -> int | None:
    """Which slot (an index into `running`; None entries are idle slots) a waiting request
    of `rank` takes back, if any."""
    best: int | None = None
    for i, r in enumerate(running):
        if r is None or not r.parkable or r.rank <= rank:
            continue
        b = running[best] if best is not None else None
        if b is None or (r.rank, r.admitted) > (b.rank, b.admitted):
            best = i
    return best


def to_make_way(waiting: Sequence[int], running: Sequence[Running | None]) -> list[int]:
    """The slots to take back, in order, so that the waiting requests (their ranks, in line
    order) each get one: idle slots go to the first in line; past them, each takes the
    slot `victim` names, until one has none to take (the line's order holds: nobody
    behind it overtakes it)."""
    left = list(running)
    idle = sum(r is None for r in left)
    out: list[int] = []
    for rank in waiting:
        if idle:
            idle -= 1
            continue
        v = victim(left, rank)
        if v is None:
            break
        out.append(v)
        left[v] = Running(rank, float("inf"), parkable=False)  # it runs there now
    return out


def worst_in_step(running: Sequence[tuple[int, bool]]) -> int | None:
    """The worst rank a decode step may carry, given each running request's (rank, whether
    it is still prefilling its prompt); None: every rank. A step that carries a class's
    prompt carries no worse class: the prompt is then the step's whole work, and its first
    token comes as fast as on an idle model (on two cores, three batch decodes beside a
    short prompt made its step 40% longer: bench/priorities.py). The worse classes lose
    that step, once per prompt chunk of a better one."""
    prefilling = [rank for rank, pre in running if pre]
    return min(prefilling) if prefilling else None


class Ranked(Protocol):
    rank: int
    n_gen: int


R = TypeVar("R", bound=Ranked)


def in_step(slots: Sequence[Slot[R]], pending: Callable[[Slot[R]], int]) -> Sequence[Slot[R]]:
    """The slots whose requests the next step may carry (`worst_in_step`); `pending` says
    how many of a slot's tokens are still to decode."""
    worst = worst_in_step([(r.rank, r.n_gen == 0 and pending(s) > 0) for s in slots if (r := s.request) is not None])
    if worst is None:
        return slots
    return [s for s in slots if s.request is None or s.request.rank <= worst]
