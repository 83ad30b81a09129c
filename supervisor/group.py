"""A model of several instances (`instances = N`), shown to the router as one model.

The group keeps the client surface of a ModelHandle that the routes use (name, spec,
state, statistics, leases, unloads), so a route serves a group as it serves a handle; a
model of one instance stays a bare ModelHandle. Each instance is a ModelHandle with its
own run loop, which the supervisor runs, plans and stops like any model's; the group
writes no lifecycle state of its own, it forwards asks and sums what it reads.

Which instance serves a generation is the router's choice (router/generation/
instances.py), with the session affinity and failover of upstream replicas. `acquire()`
here is the default for everything else (tokenize, /props, slot files): the least busy
ready instance.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from contextlib import AbstractAsyncContextManager
from typing import Callable, Iterable, Union

import trio

from supervisor.config import ModelSpec, SupervisorConfig
from supervisor.connection import WorkerConnection
from supervisor.errors import WorkerUnavailable
from supervisor.handle import ModelHandle
from supervisor.instances import group_state, instance_spec
from supervisor.lease import Lease, leased
from supervisor.lifecycle import State
from supervisor.slot_order import Place
from supervisor.slot_queue import Ticket
from supervisor.stats import ModelStats
from worker.protocol import Ready


class ModelGroup:
    def __init__(self, spec: ModelSpec, instances: list[ModelHandle]) -> None:
        self.spec = spec  # the model's, under its own name
        self.instances = instances
        # The router's memory of where a conversation was served last: session key ->
        # (instance label, that instance's worker start). A hint, never trusted past a
        # restart, which lost the worker's cache (router/generation/instances.py).
        self.served_on: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self.failed_over = 0  # requests retried on another instance

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def state(self) -> State:
        return group_state([h.state for h in self.instances])

    @property
    def sleeping(self) -> bool:
        return self.state is State.STOPPED and any(h.sleeping for h in self.instances)

    @property
    def in_flight(self) -> int:
        return sum(h.in_flight for h in self.instances)

    @property
    def last_ready(self) -> Ready | None:
        return next((h.last_ready for h in self.instances if h.last_ready is not None), None)

    @property
    def last_error(self) -> str | None:
        return next((h.last_error for h in self.instances if h.last_error is not None), None)

    @property
    def conn(self) -> WorkerConnection | None:
        """A ready instance's worker (what a route reads its loaded facts from), or None."""
        return self.least_busy().conn if self.state is State.READY else None

    @property
    def rss(self) -> int | None:
        return _sum(h.rss for h in self.instances)

    @property
    def keep_alive(self) -> float | None:
        return self.instances[0].keep_alive  # set on every instance alike

    @property
    def last_used_wall(self) -> float | None:
        return max((h.last_used_wall for h in self.instances if h.last_used_wall is not None), default=None)

    @property
    def backoff_until(self) -> float:
        return min((h.backoff_until for h in self.instances), default=0.0)

    def statistics(self) -> ModelStats:
        """The instances' numbers summed, under the model's name; `pid` is None (several)."""
        each = [h.statistics() for h in self.instances]
        first = each[0]
        ready = [s for s in each if s.state is State.READY]
        return dataclasses.replace(
            first,
            name=self.name, aliases=tuple(self.spec.aliases), state=self.state,
            pid=None, rss_bytes=_sum(s.rss_bytes for s in each),
            slots=sum(s.slots for s in (ready or each[:1])),
            slots_busy=sum(s.slots_busy for s in each), queued=sum(s.queued for s in each),
            waiting=sum(s.waiting for s in each), in_flight=sum(s.in_flight for s in each),
            waiting_by_priority={
                c: sum(s.waiting_by_priority[c] for s in each) for c in first.waiting_by_priority
            },
            last_used=max((s.last_used for s in each if s.last_used is not None), default=None),
            restarts=sum(s.restarts for s in each), last_error=self.last_error,
            cost_bytes=sum(s.cost_bytes for s in each),
            threads=_sum(s.threads for s in each),
            loaded=next((s.loaded for s in each if s.loaded is not None), None),
            requests_per_minute=sum(s.requests_per_minute for s in each),
            tokens_generated=_sum(s.tokens_generated for s in each),
        )

    # ---- clients --------------------------------------------------------------------------

    def least_busy(self) -> ModelHandle:
        """A ready instance with the fewest requests in flight, else the first that has not
        failed (acquiring it loads it), else the first."""
        ready = [h for h in self.instances if h.state is State.READY]
        if ready:
            return min(ready, key=lambda h: h.in_flight)
        return next((h for h in self.instances if h.state is not State.FAILED), self.instances[0])

    def lease(self) -> AbstractAsyncContextManager[WorkerConnection]:
        return leased(self.acquire)

    async def acquire(self) -> Lease:
        return await self.least_busy().acquire()

    def instance_of(self, conn: WorkerConnection) -> ModelHandle:
        """The instance whose worker `conn` is (it holds a lease on it)."""
        for h in self.instances:
            if h.conn is conn:
                return h
        raise WorkerUnavailable(f"model {self.name!r}: that worker has stopped", retry=True)

    async def take_slots(self, conn: WorkerConnection, slots: int, place: Place = Place()) -> Ticket:
        return await self.instance_of(conn).take_slots(conn, slots, place)

    async def ensure_ready(self) -> None:
        """Load every instance (an admin's load, a keep_alive): all serve once it returns."""
        async with trio.open_nursery() as nursery:
            for h in self.instances:
                nursery.start_soon(h.ensure_ready)

    def set_keep_alive(self, seconds: float | None) -> None:
        for h in self.instances:
            h.set_keep_alive(seconds)

    def request_unload(self, force: bool = False, reason: str = "unloaded by an admin") -> None:
        for h in self.instances:
            h.request_unload(force, reason)

    def respec(self, spec: ModelSpec) -> None:
        """A reload's spec for the same number of instances (the supervisor replaces a
        group whose count changed): each instance restarts only if its own spec changed."""
        self.spec = spec
        for i, h in enumerate(self.instances):
            h.respec(instance_spec(spec, i))

    def adopt_settings(self, settings: SupervisorConfig) -> None:
        for h in self.instances:
            h.adopt_settings(settings)

    async def reset(self) -> bool:
        reset = False
        for h in self.instances:
            reset = await h.reset() or reset
        return reset

    def retire(self) -> None:
        for h in self.instances:
            h.retire()

    def request_shutdown(self) -> None:
        for h in self.instances:
            h.request_shutdown()


def _sum(values: Iterable[int | None]) -> int | None:
    """The sum of the values that are known; None when none is."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


# What a route serves a local model through: one worker's handle, or a group of instances.
Served = Union[ModelHandle, ModelGroup]


def served_for(spec: ModelSpec, make: Callable[[ModelSpec], ModelHandle]) -> Served:
    """The model `spec` configures: one handle made by `make`, or a group of `instances`."""
    if spec.instances <= 1:
        return make(spec)
    return ModelGroup(spec, [make(instance_spec(spec, i)) for i in range(spec.instances)])


def workers_of(served: Iterable[Served]) -> list[ModelHandle]:
    """Every handle with a run loop of its own: the instances of each group."""
    return [h for s in served for h in (s.instances if isinstance(s, ModelGroup) else [s])]


def regroup(
    old: Served, spec: ModelSpec, make: Callable[[ModelSpec], ModelHandle]
) -> tuple[Served, list[ModelHandle]]:
    """A reload's `spec` for a model served as `old`: what serves it now (instances it did
    not have made by `make`), and the handles to retire. The instances both configs have
    are kept and respec'd (each restarts only if its own spec changed); the first keeps the
    model's name, so turning `instances` on or off keeps its worker serving."""
    kept = old.instances if isinstance(old, ModelGroup) else [old]
    keep, leave = kept[: spec.instances], kept[spec.instances :]
    for i, h in enumerate(keep):
        h.respec(instance_spec(spec, i) if spec.instances > 1 else spec)
    for h in leave:
        h.retire()
    handles = keep + [make(instance_spec(spec, i)) for i in range(len(keep), spec.instances)]
    served: Served = handles[0] if spec.instances <= 1 else ModelGroup(spec, handles)
    if isinstance(old, ModelGroup) and isinstance(served, ModelGroup):
        served.served_on = old.served_on
    return served, leave
