"""Capacity under the virtual clock: max_loaded_models, memory_budget, LRU eviction of idle
models, the FIFO load queue with load_wait, and the division of cores."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from supervisor.errors import WorkerUnavailable
from supervisor.handle import ModelHandle
from supervisor.lifecycle import State
from supervisor.supervisor import Supervisor
from tests.harness import make_config, running, write_gguf
from tests.sim.support import complete, sim_supervisor, until_state
from tests.behaviour import Behaviour
from tests.sim_worker import SimLauncher

GiB = 1024**3
SLOW = Behaviour(tokens_per_sec=0.1)  # a 3-token request takes 30 s


def sparse(tmp_path: Path, name: str, size: int) -> str:
    """A model file of `size` bytes that takes no disk. Its header names no layers, so it
    costs its size and a worker's base (WORKER_BASE_BYTES, 96 MiB), no KV cache."""
    write_gguf(tmp_path / name, size)
    return name


def states(sup: Supervisor) -> dict[str, str]:
    return {name: h.state.value for name, h in sup.handles.items()}


async def hold(sup: Supervisor, model: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Keep one request in flight on `model` until cancelled."""
    async with sup.resolve(model).lease():
        task_status.started()
        await trio.sleep_forever()


async def test_the_least_recently_used_idle_model_is_evicted(tmp_path: Path, autojump_clock: object) -> None:
    sup, launcher = sim_supervisor(tmp_path, {"a": {}, "b": {}, "c": {}}, max_loaded_models=2)
    async with running(sup):
        await complete(sup, "a")
        await trio.sleep(10)
        await complete(sup, "b")
        await trio.sleep(10)
        await complete(sup, "a")  # now b is the least recently used
        await complete(sup, "c")
        assert states(sup) == {"a": "ready", "b": "stopped", "c": "ready"}
        assert [name for name, _ in launcher.stops] == ["b"]
        assert [s.name for s in launcher.starts] == ["a", "b", "c"]


async def test_a_busy_model_is_never_evicted(tmp_path: Path, autojump_clock: object) -> None:
    sup, launcher = sim_supervisor(tmp_path, {"a": {}, "b": {}, "c": {}}, max_loaded_models=2)
    async with running(sup), trio.open_nursery() as nursery:
        await nursery.start(hold, sup, "a")  # a: least recently used, but busy
        await trio.sleep(10)
        await complete(sup, "b")
        await complete(sup, "c")
        assert states(sup) == {"a": "ready", "b": "stopped", "c": "ready"}
        nursery.cancel_scope.cancel()


async def test_a_pinned_model_is_never_evicted(tmp_path: Path, autojump_clock: object) -> None:
    sup, launcher = sim_supervisor(
        tmp_path, {"a": {"pinned": True}, "b": {}, "c": {}}, max_loaded_models=2
    )
    async with running(sup):
        await complete(sup, "a")
        await trio.sleep(10)
        await complete(sup, "b")
        await complete(sup, "c")
        assert states(sup) == {"a": "ready", "b": "stopped", "c": "ready"}


async def test_waiters_are_served_in_arrival_order(tmp_path: Path, autojump_clock: object) -> None:
    models = {"a": {}, "b": {}, "c": {}, "d": {}}
    sup, launcher = sim_supervisor(
        tmp_path, models, {m: SLOW for m in models}, max_loaded_models=1, load_wait=600
    )
    finished: list[tuple[str, float]] = []

    async def ask(model: str) -> None:
        await complete(sup, model)
        finished.append((model, trio.current_time()))

    async with running(sup):
        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "a")
            for model in ("c", "b", "d"):  # not in name order, to show it is arrival order
                await trio.sleep(1)
                nursery.start_soon(ask, model)
        assert [s.name for s in launcher.starts] == ["a", "c", "b", "d"]
        assert [m for m, _ in finished] == ["a", "c", "b", "d"]
        # Each ran its 30 s alone, one after the other.
        assert [round(t - t0) for _, t in finished] == [30, 60, 90, 120]


async def test_a_queued_request_gets_503_with_retry_after_after_load_wait(
    tmp_path: Path, autojump_clock: object
) -> None:
    sup, launcher = sim_supervisor(tmp_path, {"a": {}, "b": {}}, max_loaded_models=1, load_wait=30)
    async with running(sup), trio.open_nursery() as nursery:
        await nursery.start(hold, sup, "a")
        t0 = trio.current_time()
        with pytest.raises(WorkerUnavailable) as err:
            await complete(sup, "b")
        assert trio.current_time() - t0 == pytest.approx(30, abs=0.01)
        assert err.value.retry and err.value.retry_after == 5
        assert "max_loaded_models = 1" in err.value.message and "'a'" in err.value.message
        assert [s.name for s in launcher.starts] == ["a"]
        await trio.testing.wait_all_tasks_blocked()
        assert sup.admission.queued() == []
        nursery.cancel_scope.cancel()


async def test_a_waiter_that_disconnects_leaves_the_queue(tmp_path: Path, autojump_clock: object) -> None:
    models = {"a": {}, "b": {}, "c": {}}
    sup, launcher = sim_supervisor(tmp_path, models, max_loaded_models=1, load_wait=600)
    async with running(sup):
        async with trio.open_nursery() as nursery:
            a_request = trio.CancelScope()

            async def hold_a(task_status: trio.TaskStatus[None]) -> None:
                with a_request:
                    await hold(sup, "a", task_status=task_status)

            await nursery.start(hold_a)
            with trio.move_on_after(5):  # the client of b goes away after 5 s
                await complete(sup, "b")
            await trio.testing.wait_all_tasks_blocked()
            assert sup.admission.queued() == []
            nursery.start_soon(complete, sup, "c")
            await trio.sleep(1)
            assert sup.admission.queued() == ["c"]
            a_request.cancel()  # a's request ends, so a may be evicted, and c loads
        assert [s.name for s in launcher.starts] == ["a", "c"]
        assert states(sup) == {"a": "stopped", "b": "stopped", "c": "ready"}


async def test_memory_budget_evicts_only_as_much_as_needed(tmp_path: Path, autojump_clock: object) -> None:
    models = {
        "a": {"path": sparse(tmp_path, "a.gguf", 1 * GiB)},
        "b": {"path": sparse(tmp_path, "b.gguf", 1 * GiB)},
        "c": {"path": sparse(tmp_path, "c.gguf", 2 * GiB)},
    }
    sup, launcher = sim_supervisor(tmp_path, models, memory_budget="3.5GiB")
    async with running(sup):
        await complete(sup, "a")
        await trio.sleep(1)
        await complete(sup, "b")
        assert states(sup) == {"a": "ready", "b": "ready", "c": "stopped"}
        # 1 + 1 + 2 GiB and 3 x 96 MiB > 3.5 GiB: a (least recent) goes, b stays
        await complete(sup, "c")
        assert states(sup) == {"a": "stopped", "b": "ready", "c": "ready"}


async def test_a_model_larger_than_the_budget_still_runs_alone(tmp_path: Path, autojump_clock: object) -> None:
    models = {
        "small": {"path": sparse(tmp_path, "s.gguf", 1 * GiB)},
        "huge": {"path": sparse(tmp_path, "h.gguf", 4 * GiB)},
    }
    sup, launcher = sim_supervisor(tmp_path, models, memory_budget="2GiB")
    async with running(sup):
        await complete(sup, "small")
        assert await complete(sup, "huge") == "tok0 tok1 tok2"
        assert states(sup) == {"small": "stopped", "huge": "ready"}


async def test_a_request_during_backoff_waits_up_to_load_wait(tmp_path: Path, autojump_clock: object) -> None:
    sup, launcher = sim_supervisor(
        tmp_path, {"a": {}}, {"a": Behaviour(exit_at_start=True)},
        backoff_base=100, backoff_max=300, load_wait=30, start_retries=5,
    )
    async with running(sup):
        t0 = trio.current_time()
        with pytest.raises(WorkerUnavailable) as err:
            await complete(sup, "a")
        assert trio.current_time() - t0 == pytest.approx(30, abs=0.01)
        assert err.value.retry and err.value.retry_after == pytest.approx(70, abs=0.01)
        assert "backing off" in err.value.message
        h = sup.resolve("a")
        assert h.state is State.BACKOFF
        # Nobody waits any more: when the delay ends it rests instead of retrying.
        await until_state(h, State.STOPPED)
        assert trio.current_time() - t0 == pytest.approx(100, abs=0.01)
        assert len(launcher.starts) == 1


async def test_a_request_that_fits_the_backoff_window_is_served(tmp_path: Path, autojump_clock: object) -> None:
    behaviours = {"a": Behaviour(exit_at_start=True)}
    sup, launcher = sim_supervisor(tmp_path, {"a": {}}, behaviours, backoff_base=10, load_wait=30)
    async with running(sup):
        async with trio.open_nursery() as nursery:
            result: list[str] = []

            async def ask() -> None:
                result.append(await complete(sup, "a"))

            nursery.start_soon(ask)
            await trio.sleep(1)  # the first start has failed; fix the model during backoff
            behaviours["a"] = Behaviour()
        assert result == ["tok0 tok1 tok2"]
        assert [round(s.at) for s in launcher.starts] == [0, 10]


def shares(launcher: SimLauncher, handles: dict[str, ModelHandle]) -> dict[str, int | None]:
    return {n: h.worker_threads for n, h in handles.items() if h.state is State.READY}


async def test_cores_are_divided_among_the_models_loaded_together(tmp_path: Path, autojump_clock: object) -> None:
    models: dict[str, dict[str, object]] = {"a": {}, "b": {}, "c": {}, "d": {"threads": 2}}
    sup, launcher = sim_supervisor(tmp_path, models, cores=8)
    async with running(sup):
        await complete(sup, "a")
        assert launcher.starts_of("a")[0].threads == 8
        await complete(sup, "b")
        assert launcher.starts_of("b")[0].threads == 4
        assert launcher.starts_of("a")[0].set_threads == [4]  # told while running
        await complete(sup, "d")  # fixed at 2: the other two share 6
        assert launcher.starts_of("d")[0].threads == 2
        await complete(sup, "c")
        loaded = shares(launcher, sup.handles)
        assert loaded == {"a": 2, "b": 2, "c": 2, "d": 2}
        assert sum(v or 0 for v in loaded.values()) <= 8
        sup.resolve("b").request_unload()
        sup.resolve("c").request_unload()
        await until_state(sup.resolve("c"), State.STOPPED)
        await until_state(sup.resolve("b"), State.STOPPED)
        await trio.sleep(1)
        assert shares(launcher, sup.handles) == {"a": 6, "d": 2}
        assert launcher.starts_of("a")[0].set_threads[-1] == 6
        assert launcher.starts_of("d")[0].set_threads == []  # its own setting, never touched


async def test_the_prompt_cache_budget_is_shared_among_the_models_loaded_together(
    tmp_path: Path, autojump_clock: object
) -> None:
    """supervisor.prompt_cache_budget (issue 24): 3 GiB for all; "b" asks only 512 MiB of
    its own, so "a" and "c" share the rest; a share follows the set of loaded models, told
    to a running worker (SetCacheBudget) as a share of the cores is."""
    gib = 1 << 30
    models: dict[str, dict[str, object]] = {"a": {}, "b": {"prompt_cache_bytes": gib // 2}, "c": {}}
    sup, launcher = sim_supervisor(tmp_path, models, prompt_cache_budget="3GiB")
    async with running(sup):
        await complete(sup, "a")
        assert launcher.starts_of("a")[0].prompt_cache_bytes == gib  # its own bound (1 GiB) is under 3 GiB
        await complete(sup, "b")
        assert launcher.starts_of("b")[0].prompt_cache_bytes == gib // 2
        await complete(sup, "c")
        assert launcher.starts_of("c")[0].prompt_cache_bytes == gib  # (3 - 0.5) / 2 > 1 GiB: its own
        assert launcher.starts_of("a")[0].cache_budgets == []  # nothing changed for it
    models = {"a": {"prompt_cache_bytes": 2 * gib}, "b": {"prompt_cache_bytes": gib // 2}, "c": {"prompt_cache_bytes": 2 * gib}}
    sup, launcher = sim_supervisor(tmp_path, models, prompt_cache_budget="3GiB")
    async with running(sup):
        await complete(sup, "a")
        assert launcher.starts_of("a")[0].prompt_cache_bytes == 2 * gib
        await complete(sup, "b")
        await complete(sup, "c")
        started = {n: launcher.starts_of(n)[0] for n in "abc"}
        told = {n: (s.cache_budgets or [s.prompt_cache_bytes])[-1] for n, s in started.items()}
        assert told == {"a": 5 * gib // 4, "b": gib // 2, "c": 5 * gib // 4}
        assert sum(told.values()) <= 3 * gib
        sup.resolve("c").request_unload()
        await until_state(sup.resolve("c"), State.STOPPED)
        await trio.sleep(1)
        assert started["a"].cache_budgets[-1] == 2 * gib  # back to its own bound


async def test_a_reload_that_raises_the_limit_lets_the_queue_move(tmp_path: Path, autojump_clock: object) -> None:
    models: dict[str, dict[str, object]] = {"a": {}, "b": {}}
    sup, launcher = sim_supervisor(tmp_path, models, max_loaded_models=1, load_wait=600)
    async with running(sup), trio.open_nursery() as nursery:
        await nursery.start(hold, sup, "a")
        nursery.start_soon(complete, sup, "b")
        await trio.sleep(10)
        assert sup.admission.queued() == ["b"]
        sup.reload(make_config(tmp_path, models, max_loaded_models=2, load_wait=600))
        await until_state(sup.resolve("b"), State.READY)
        assert states(sup) == {"a": "ready", "b": "ready"}
        nursery.cancel_scope.cancel()
