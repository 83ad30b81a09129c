"""Lifecycle timing under trio's virtual clock: idle unload, backoff, start timeout,
min_uptime and hung-worker detection, each checked to the (virtual) second."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from supervisor.errors import WorkerUnavailable
from supervisor.lifecycle import State
from tests.harness import running
from tests.sim.support import complete, sim_supervisor, until_state
from tests.behaviour import Behaviour


async def test_idle_unload_fires_exactly_after_idle_timeout(tmp_path: Path, autojump_clock: object) -> None:
    sup, launcher = sim_supervisor(tmp_path, {"a": {"idle_timeout": 600}})
    async with running(sup):
        h = sup.resolve("a")
        assert await complete(sup, "a") == "tok0 tok1 tok2"
        ended = h.last_used
        stopped = await until_state(h, State.STOPPED)
        assert stopped - ended == pytest.approx(600, abs=0.01)
        assert len(launcher.stops) == 1


async def test_idle_timeout_never_fires_with_a_request_in_flight(tmp_path: Path, autojump_clock: object) -> None:
    # A 300 s request on a model whose idle_timeout is 10 s.
    sup, launcher = sim_supervisor(
        tmp_path, {"a": {"idle_timeout": 10}}, {"a": Behaviour(tokens_per_sec=0.01)}
    )
    async with running(sup):
        h = sup.resolve("a")
        t0 = trio.current_time()
        assert await complete(sup, "a") == "tok0 tok1 tok2"
        assert trio.current_time() - t0 == pytest.approx(300, abs=0.01)
        assert len(launcher.starts) == 1 and not launcher.stops
        stopped = await until_state(h, State.STOPPED)
        assert stopped - h.last_used == pytest.approx(10, abs=0.01)


async def test_crash_loop_backs_off_exponentially_then_fails(tmp_path: Path, autojump_clock: object) -> None:
    sup, launcher = sim_supervisor(
        tmp_path, {"a": {}}, {"a": Behaviour(exit_at_start=True)},
        start_retries=3, backoff_base=1, backoff_max=60, load_wait=600,
    )
    async with running(sup):
        t0 = trio.current_time()
        with pytest.raises(WorkerUnavailable) as err:
            await complete(sup, "a")
        assert err.value.retry is False
        starts = [s.at - t0 for s in launcher.starts]
        assert starts == pytest.approx([0, 1, 3, 7], abs=0.01)
        assert sup.resolve("a").state is State.FAILED
        # A failed model answers at once, without another start.
        with pytest.raises(WorkerUnavailable):
            await complete(sup, "a")
        assert len(launcher.starts) == 4 and trio.current_time() - t0 == pytest.approx(7, abs=0.01)


async def test_backoff_is_capped_at_backoff_max(tmp_path: Path, autojump_clock: object) -> None:
    sup, launcher = sim_supervisor(
        tmp_path, {"a": {}}, {"a": Behaviour(fail_load="bad file")},
        start_retries=4, backoff_base=10, backoff_max=15, load_wait=600,
    )
    async with running(sup):
        with pytest.raises(WorkerUnavailable, match="bad file"):
            await complete(sup, "a")
        at = [s.at for s in launcher.starts]
        assert [b - a for a, b in zip(at, at[1:])] == pytest.approx([10, 15, 15, 15], abs=0.01)


async def test_start_timeout_counts_as_a_failed_start(tmp_path: Path, autojump_clock: object) -> None:
    sup, launcher = sim_supervisor(
        tmp_path, {"a": {}}, {"a": Behaviour(load_delay=500)},
        start_timeout=120, start_retries=0,
    )
    async with running(sup):
        t0 = trio.current_time()
        with pytest.raises(WorkerUnavailable, match="start_timeout=120"):
            await complete(sup, "a")
        assert trio.current_time() - t0 == pytest.approx(120, abs=0.01)


@pytest.mark.parametrize(("die_after", "expect"), [(2.0, State.BACKOFF), (6.0, State.STOPPED)])
async def test_min_uptime_separates_failed_starts_from_crashes(
    tmp_path: Path, autojump_clock: object, die_after: float, expect: State
) -> None:
    sup, launcher = sim_supervisor(
        tmp_path, {"a": {}}, {"a": Behaviour(die_after=die_after)}, min_uptime=5, backoff_base=30
    )
    async with running(sup):
        h = sup.resolve("a")
        await complete(sup, "a", max_tokens=1)
        await until_state(h, expect)
        assert h.failures == (1 if expect is State.BACKOFF else 0)


async def test_hung_worker_is_replaced_within_interval_times_misses_plus_one(
    tmp_path: Path, autojump_clock: object
) -> None:
    """Pins d991dff: detection could overrun health_interval * (health_misses + 1), and a
    killed worker was replaced only when the next request asked for one."""
    behaviours = {"a": Behaviour(hang=True)}
    sup, launcher = sim_supervisor(
        tmp_path, {"a": {}}, behaviours, health_interval=10, health_misses=3
    )
    async with running(sup):
        h = sup.resolve("a")
        held = await h.acquire()
        hung_at = trio.current_time()  # Ready was its last answer
        behaviours["a"] = Behaviour(load_delay=2)  # the replacement is healthy
        held.release()
        await until_state(h, State.STOPPED)
        # Three pings unanswered, the last one for half an interval: 35 s.
        assert trio.current_time() - hung_at == pytest.approx(35, abs=0.01)
        assert "hung" in (h.last_error or "")
        # Replaced at once, with no request asking, within interval * (misses + 1).
        await until_state(h, State.READY)
        assert trio.current_time() - hung_at == pytest.approx(37, abs=0.01)
        assert len(launcher.starts) == 2
        assert await complete(sup, "a") == "tok0 tok1 tok2"


async def test_a_pinned_model_whose_worker_crashes_is_loaded_again_at_once(
    tmp_path: Path, autojump_clock: object
) -> None:
    """Pins d991dff: a pinned model stayed unloaded after a crash until a request came."""
    # Both workers die 10 s after Ready, past min_uptime: a crash, not a failed start.
    behaviours = {"a": Behaviour(die_after=10), "b": Behaviour(die_after=10)}
    sup, launcher = sim_supervisor(tmp_path, {"a": {"pinned": True}, "b": {}}, behaviours, min_uptime=1)
    async with running(sup):
        assert await complete(sup, "a") == "tok0 tok1 tok2"
        assert await complete(sup, "b") == "tok0 tok1 tok2"
        behaviours.update(a=Behaviour(), b=Behaviour())
        await trio.sleep(60)
        assert sup.resolve("a").state is State.READY  # pinned: kept loaded
        assert sup.resolve("b").state is State.STOPPED  # started again by its next request
        assert [start.name for start in launcher.starts] == ["a", "b", "a"]
        assert sup.resolve("a").crashes == sup.resolve("b").crashes == 1


async def test_a_busy_worker_that_answers_pings_is_never_killed(tmp_path: Path, autojump_clock: object) -> None:
    sup, launcher = sim_supervisor(
        tmp_path, {"a": {}}, {"a": Behaviour(tokens_per_sec=0.05)}, health_interval=1, health_misses=1
    )
    async with running(sup):
        assert await complete(sup, "a", max_tokens=5) == "tok0 tok1 tok2 tok3 tok4"  # 100 s
        assert len(launcher.starts) == 1 and sup.resolve("a").crashes == 0


async def test_ten_concurrent_first_requests_share_one_load(tmp_path: Path, autojump_clock: object) -> None:
    sup, launcher = sim_supervisor(tmp_path, {"a": {}}, {"a": Behaviour(load_delay=5)})
    async with running(sup):
        texts: list[str] = []

        async def ask() -> None:
            texts.append(await complete(sup, "a"))

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(ask)
        assert texts == ["tok0 tok1 tok2"] * 10
        assert len(launcher.starts) == 1


async def test_a_request_during_a_stop_waits_for_it_then_starts_a_new_worker(
    tmp_path: Path, autojump_clock: object
) -> None:
    """llama-swap #946 on the virtual clock, with an admin unload instead of an idle one: the
    request that arrives mid-stop is served by a new worker once the old one is gone."""
    # The worker ignores Shutdown, so its stop takes stop_grace + 1 s before the kill.
    behaviours = {"a": Behaviour(ignore_shutdown=True)}
    sup, launcher = sim_supervisor(tmp_path, {"a": {}}, behaviours, stop_grace=10)
    async with running(sup):
        h = sup.resolve("a")
        await complete(sup, "a")
        behaviours["a"] = Behaviour()
        h.request_unload()
        await until_state(h, State.STOPPING)
        t0 = trio.current_time()
        assert await complete(sup, "a") == "tok0 tok1 tok2"
        assert trio.current_time() - t0 >= 11  # it waited out the stop
        assert len(launcher.starts) == 2 and launcher.stops == [("a", t0)]


@pytest.mark.parametrize("keep_alive", [0.0, 30.0, 7200.0])
async def test_a_keep_alive_is_the_idle_time_from_the_last_use(
    tmp_path: Path, autojump_clock: object, keep_alive: float
) -> None:
    """Ollama's keep_alive (supervisor/model_loop.py idle_limit), as a request sets it once
    it holds the model: 0 unloads as soon as nothing is in flight, a longer one outlasts the
    config's idle_timeout; the next load idles as the config says again."""
    sup, launcher = sim_supervisor(tmp_path, {"a": {"idle_timeout": 600}})
    async with running(sup):
        h = sup.resolve("a")
        async with h.lease():
            h.set_keep_alive(keep_alive)
        ended = h.last_used
        stopped = await until_state(h, State.STOPPED)
        assert stopped - ended == pytest.approx(keep_alive, abs=0.01)
        assert h.keep_alive is None
        assert await complete(sup, "a") == "tok0 tok1 tok2"
        ended = h.last_used
        assert await until_state(h, State.STOPPED) - ended == pytest.approx(600, abs=0.01)
        assert len(launcher.stops) == 2


async def test_a_negative_keep_alive_keeps_the_model_until_a_request_says_otherwise(
    tmp_path: Path, autojump_clock: object
) -> None:
    sup, launcher = sim_supervisor(tmp_path, {"a": {"idle_timeout": 10}})
    async with running(sup):
        h = sup.resolve("a")
        async with h.lease():
            h.set_keep_alive(-1.0)
        await trio.sleep(86400)
        assert h.state is State.READY and not launcher.stops
        async with h.lease():
            h.set_keep_alive(None)  # an Ollama request without keep_alive: the config's again
        ended = h.last_used
        assert await until_state(h, State.STOPPED) - ended == pytest.approx(10, abs=0.01)
