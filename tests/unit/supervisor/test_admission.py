"""The admission gate against fake models: first come first served, eviction of the least
recently used idle model, and leaving the queue when nobody wants the load (issue 9)."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio
import trio.testing

from supervisor.admission import Admission
from supervisor.capacity import Limits, Resident


@dataclass(eq=False)
class FakeModel:
    name: str
    cost: int = 100
    loaded: bool = False
    busy: bool = False
    last_used: float = 0.0
    want: bool = True
    unloads: list[str] = field(default_factory=list)

    @property
    def holds_memory(self) -> bool:
        return self.loaded

    def wanted(self) -> bool:
        return self.want

    def estimated_cost(self) -> int:
        return self.cost

    def estimated_gpu(self) -> dict[str, int]:
        return {}

    def resident(self) -> Resident:
        leaving = bool(self.unloads)
        return Resident(self.name, self.cost, self.last_used, evictable=not self.busy and not leaving, leaving=leaving)

    def request_unload(self, force: bool = False, reason: str = "") -> None:
        self.unloads.append(reason)


def gate(models: list[FakeModel], limits: Limits) -> Admission:
    return Admission(lambda: models, lambda: limits)


async def test_without_limits_every_load_is_admitted_at_once() -> None:
    a = FakeModel("a")
    assert await gate([a], Limits()).admit(a) is True


async def test_the_least_recently_used_idle_model_is_evicted_and_then_the_load_goes() -> None:
    old = FakeModel("old", loaded=True, last_used=1.0)
    recent = FakeModel("recent", loaded=True, last_used=5.0)
    new = FakeModel("new")
    g = gate([old, recent, new], Limits(max_models=2))
    admitted: list[bool] = []

    async def load() -> None:
        admitted.append(await g.admit(new))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(load)
        await trio.testing.wait_all_tasks_blocked()
        assert old.unloads == ["evicted to make room for new"] and recent.unloads == []
        assert admitted == [] and g.queued() == ["new"]
        old.loaded = False  # its worker has stopped
        g.poke()
    assert admitted == [True]
    assert g.queued() == []


async def test_a_busy_model_is_waited_for_not_evicted() -> None:
    busy = FakeModel("busy", loaded=True, busy=True)
    new = FakeModel("new")
    g = gate([busy, new], Limits(max_models=1))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(g.admit, new)
        await trio.testing.wait_all_tasks_blocked()
        assert busy.unloads == []
        assert g.queued() == ["new"] and g.waiting_reason(new) is not None
        nursery.cancel_scope.cancel()  # the request gave up
    assert g.queued() == []  # a cancelled wait leaves the queue


async def test_first_come_first_served_and_an_unwanted_load_leaves_the_queue() -> None:
    resident = FakeModel("resident", loaded=True, busy=True)
    first, second = FakeModel("first"), FakeModel("second", cost=1)
    g = gate([resident, first, second], Limits(max_models=1))
    results: dict[str, bool] = {}

    async def load(m: FakeModel) -> None:
        results[m.name] = await g.admit(m)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(load, first)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(load, second)
        await trio.testing.wait_all_tasks_blocked()
        assert g.queued() == ["first", "second"]
        assert g.waiting_reason(second) == "waiting for its turn in the load queue"
        first.want = False  # its requests gave up
        g.poke()
        await trio.testing.wait_all_tasks_blocked()
        assert results == {"first": False}
        assert g.queued() == ["second"]  # now the head, and planned for
        resident.busy = False
        resident.loaded = False
        g.poke()
    assert results == {"first": False, "second": True}
