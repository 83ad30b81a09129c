"""supervisor/replan.py: many changes, one plan run; settled() waits for a plan that saw them."""

from __future__ import annotations

import trio
import trio.testing

from supervisor.replan import Replanner


async def test_a_burst_of_changes_is_planned_once() -> None:
    runs: list[int] = []
    planner = Replanner(lambda: runs.append(1))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(planner.run)
        for _ in range(50):
            planner.changed()  # all in one scheduler tick, as a burst of state changes is
        await trio.testing.wait_all_tasks_blocked()
        assert len(runs) == 1
        planner.changed()
        await trio.testing.wait_all_tasks_blocked()
        assert len(runs) == 2
        nursery.cancel_scope.cancel()


async def test_settled_waits_for_a_plan_that_saw_the_change() -> None:
    seen: list[int] = []
    state = {"value": 0}
    planner = Replanner(lambda: seen.append(state["value"]))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(planner.run)
        await trio.testing.wait_all_tasks_blocked()
        state["value"] = 7
        planner.changed()
        with trio.fail_after(1):
            await planner.settled()
        assert seen and seen[-1] == 7  # the plan that ran had the change in view
        nursery.cancel_scope.cancel()


async def test_settled_returns_at_once_when_nothing_is_pending() -> None:
    planner = Replanner(lambda: None)
    with trio.fail_after(1):
        await planner.settled()  # no planner task running, and nothing asked: no wait
