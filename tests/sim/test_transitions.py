"""The transition table, edge by edge: for every (old, new) in supervisor/lifecycle.py a
scenario drives a real ModelHandle (with simulated workers, on the virtual clock) across
that edge. An edge added to the table without a scenario fails here, and so does a scenario
whose edge the handle never takes."""

from __future__ import annotations

from pathlib import Path
from typing import Awaitable, Callable

import pytest
import trio

import supervisor.model_loop
from supervisor.errors import WorkerCrashed, WorkerUnavailable
from supervisor.lifecycle import TRANSITIONS, State, check
from supervisor.supervisor import Supervisor
from tests.harness import make_config, running
from tests.sim.support import complete, sim_supervisor, until_busy, until_state
from tests.behaviour import Behaviour

S = State
Scenario = Callable[[Path], Awaitable[None]]
SCENARIOS: dict[tuple[State, State], Scenario] = {}


async def expect_crash(sup: Supervisor, model: str = "a") -> None:
    with pytest.raises(WorkerCrashed):
        await complete(sup, model)


def scenario(*edges: tuple[State, State]) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        for edge in edges:
            SCENARIOS[edge] = fn
        return fn

    return register


async def expect_503(sup: Supervisor, model: str = "a") -> WorkerUnavailable:
    with pytest.raises(WorkerUnavailable) as err:
        await complete(sup, model)
    return err.value


@scenario((S.STOPPED, S.STARTING), (S.STARTING, S.READY), (S.READY, S.STOPPING), (S.STOPPING, S.STOPPED))
async def request_then_idle(tmp_path: Path) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {"idle_timeout": 5}})
    async with running(sup):
        await complete(sup, "a")
        await until_state(sup.resolve("a"), S.STOPPED)


@scenario((S.STARTING, S.BACKOFF), (S.BACKOFF, S.STARTING))
async def failed_load_then_retry(tmp_path: Path) -> None:
    behaviours = {"a": Behaviour(fail_load="broken")}
    sup, launcher = sim_supervisor(tmp_path, {"a": {}}, behaviours, start_retries=1)
    async with running(sup):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(complete, sup, "a")
            await until_state(sup.resolve("a"), S.BACKOFF)
            behaviours["a"] = Behaviour()
        assert len(launcher.starts) == 2


@scenario((S.STARTING, S.FAILED), (S.FAILED, S.STOPPED))
async def failed_load_without_retries_then_reset(tmp_path: Path) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {}}, {"a": Behaviour(fail_load="x")}, start_retries=0)
    async with running(sup):
        assert (await expect_503(sup)).retry is False
        assert await sup.resolve("a").reset()


@scenario((S.STOPPED, S.FAILED))
async def model_file_gone_at_start(tmp_path: Path) -> None:
    sup, launcher = sim_supervisor(tmp_path, {"a": {}})
    (tmp_path / "dummy.gguf").unlink()
    async with running(sup):
        assert "no such file" in str(await expect_503(sup))
    assert launcher.starts == []


@scenario((S.BACKOFF, S.FAILED))
async def model_file_gone_during_a_backoff(tmp_path: Path) -> None:
    sup, launcher = sim_supervisor(tmp_path, {"a": {}}, {"a": Behaviour(fail_load="broken")}, start_retries=3)
    async with running(sup):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(expect_503, sup)
            await until_state(sup.resolve("a"), S.BACKOFF)
            (tmp_path / "dummy.gguf").unlink()
    assert len(launcher.starts) == 1


@scenario((S.STARTING, S.STOPPING))
async def shutdown_during_load(tmp_path: Path) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {}}, {"a": Behaviour(load_delay=100)})
    async with running(sup):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(expect_503, sup)
            await until_state(sup.resolve("a"), S.STARTING)
            await sup.stop()


@scenario((S.READY, S.DRAINING), (S.DRAINING, S.STOPPING))
async def unload_with_a_request_in_flight(tmp_path: Path) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {}}, {"a": Behaviour(tokens_per_sec=0.1)})
    async with running(sup):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(complete, sup, "a")
            await until_busy(sup.resolve("a"))
            sup.resolve("a").request_unload()
        await until_state(sup.resolve("a"), S.STOPPED)


@scenario((S.DRAINING, S.READY))
async def reload_restores_a_draining_models_config(tmp_path: Path) -> None:
    models: dict[str, dict[str, object]] = {"a": {}}
    sup, _ = sim_supervisor(tmp_path, models, {"a": Behaviour(tokens_per_sec=0.1)})
    async with running(sup):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(complete, sup, "a")
            await until_busy(sup.resolve("a"))
            sup.reload(make_config(tmp_path, {"a": {"slots": 2}}))
            await until_state(sup.resolve("a"), S.DRAINING)
            sup.reload(make_config(tmp_path, models))
            await until_state(sup.resolve("a"), S.READY)


@scenario((S.DRAINING, S.STOPPED))
async def worker_dies_while_draining(tmp_path: Path) -> None:
    sup, _ = sim_supervisor(
        tmp_path, {"a": {}}, {"a": Behaviour(tokens_per_sec=0.1, die_after=15)}, min_uptime=1
    )
    async with running(sup):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(expect_crash, sup)
            await until_busy(sup.resolve("a"))
            sup.resolve("a").request_unload()
        await until_state(sup.resolve("a"), S.STOPPED)


@scenario((S.READY, S.STOPPED))
async def crash_after_min_uptime(tmp_path: Path) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {}}, {"a": Behaviour(die_after=10)}, min_uptime=5)
    async with running(sup):
        await complete(sup, "a")
        await until_state(sup.resolve("a"), S.STOPPED)


@scenario((S.READY, S.BACKOFF), (S.BACKOFF, S.STOPPED))
async def crash_within_min_uptime_then_nobody_waits(tmp_path: Path) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {}}, {"a": Behaviour(die_after=2)}, min_uptime=5)
    async with running(sup):
        await complete(sup, "a", max_tokens=1)
        await until_state(sup.resolve("a"), S.BACKOFF)
        await until_state(sup.resolve("a"), S.STOPPED)


@scenario((S.READY, S.FAILED))
async def crash_within_min_uptime_without_retries(tmp_path: Path) -> None:
    sup, _ = sim_supervisor(
        tmp_path, {"a": {}}, {"a": Behaviour(die_after=2)}, min_uptime=5, start_retries=0
    )
    async with running(sup):
        await complete(sup, "a", max_tokens=1)
        await until_state(sup.resolve("a"), S.FAILED)
        assert (await expect_503(sup)).retry is False


def test_every_edge_has_a_scenario() -> None:
    assert set(SCENARIOS) == TRANSITIONS


@pytest.mark.parametrize(
    "edge",
    sorted(TRANSITIONS, key=lambda e: (e[0].value, e[1].value)),
    ids=lambda e: f"{e[0].value}->{e[1].value}",
)
async def test_edge_is_taken(
    edge: tuple[State, State], tmp_path: Path, autojump_clock: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[tuple[State, State]] = []

    def recording_check(old: State, new: State) -> None:
        check(old, new)
        taken.append((old, new))

    monkeypatch.setattr(supervisor.model_loop, "check", recording_check)
    with trio.fail_after(10_000):  # virtual seconds
        await SCENARIOS[edge](tmp_path)
    assert edge in taken, f"scenario {SCENARIOS[edge].__name__} took {taken}"
