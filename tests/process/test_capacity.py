"""Capacity with real (fake) worker processes: once a worker is loaded, its measured RSS
replaces the estimate from its file, and eviction decisions follow the real number."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from supervisor.lifecycle import State
from supervisor.config.gguf_meta import VOCABULARY_BYTES, WORKER_BASE_BYTES
from tests.harness import write_gguf
from tests.process.support import StartLog, alive, generate, make_supervisor, running, wait_for

MiB = 1024 * 1024


async def test_measured_rss_replaces_the_estimate_and_drives_eviction(
    tmp_path: Path, start_log: StartLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "big" is a tiny file (estimated at a worker's base, 96 MiB, and the structured-output
    # vocabulary a generating worker builds, 112 MiB: 208 MiB) whose worker holds 300 MiB;
    # "small" is a 150 MiB file (358 MiB). Judged by estimates both fit in 600 MiB; by RSS
    # they do not.
    write_gguf(tmp_path / "small.gguf", 150 * MiB)
    monkeypatch.setenv("FAKE_ALLOC_MB__big", "300")
    sup = make_supervisor(
        tmp_path, {"big": {}, "small": {"path": "small.gguf"}}, memory_budget="600MiB"
    )
    with trio.fail_after(20):
        async with running(sup):
            big, small = sup.resolve("big"), sup.resolve("small")
            assert big.cost() == (tmp_path / "dummy.gguf").stat().st_size + WORKER_BASE_BYTES + VOCABULARY_BYTES
            async with big.lease() as conn:
                await generate(conn)
            assert big.rss is not None and big.cost() == big.rss > 300 * MiB
            async with small.lease() as conn:
                await generate(conn)
            assert small.state is State.READY
            assert big.state is State.STOPPED
            assert start_log.names() == ["big", "small"]


async def test_eviction_with_two_slots_for_three_models(tmp_path: Path, start_log: StartLog) -> None:
    """max_loaded_models = 2, three models, real processes: the least recently used idle
    worker is the one stopped (its process exits), a busy one never is, the waiter is
    served once the busy one finishes, and the two loaded workers split the cores."""
    sup = make_supervisor(
        tmp_path, {"a": {}, "b": {}, "c": {}}, cores=4,
        max_loaded_models=2, load_wait=30, health_interval=0.1,
    )
    with trio.fail_after(30):
        async with running(sup):
            a, b, c = sup.resolve("a"), sup.resolve("b"), sup.resolve("c")
            for h in (a, b):
                async with h.lease() as conn:
                    await generate(conn)
            a_pid, b_pid = a.pid, b.pid
            assert a_pid is not None and b_pid is not None
            # Both workers now run on 2 of the 4 cores, as their Pongs report.
            await wait_for(
                lambda: all(h.conn and h.conn.stats and h.conn.stats.threads == 2 for h in (a, b)),
                5, "both workers on 2 threads",
            )
            held = await b.acquire()  # b busy; a least recently used but idle
            async with c.lease() as conn:
                await generate(conn)
            assert (a.state, b.state, c.state) == (State.STOPPED, State.READY, State.READY)
            assert not alive(a_pid) and alive(b_pid) and b.pid == b_pid

            # c is idle and b still busy: a request for a evicts c, never b.
            async with a.lease() as conn:
                await generate(conn)
            assert (a.state, b.state, c.state) == (State.READY, State.READY, State.STOPPED)
            held.release()
            assert start_log.names() == ["a", "b", "c", "a"]
