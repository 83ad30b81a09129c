"""Health pings: a hung worker is detected, killed and replaced; a busy one is left alone."""

from __future__ import annotations

import os
import signal
import time

import pytest
import trio

from supervisor.errors import WorkerCrashed
from supervisor.lifecycle import State
from tests.process.support import collect, expected_text, generate, make_supervisor, running, wait_for
from worker.protocol import SamplingParams

INTERVAL, MISSES = 0.2, 2
BOUND = INTERVAL * (MISSES + 1)  # the promised worst-case detection time


async def test_sigstopped_worker_is_detected_and_replaced(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")
    # min_uptime=0: a hang this soon after Ready would otherwise count as a failed start.
    sup = make_supervisor(tmp_path, {"m": {}}, health_interval=INTERVAL, health_misses=MISSES, min_uptime=0)
    handle = sup.resolve("m")
    with trio.fail_after(15):
        async with running(sup):
            async with handle.lease() as conn:
                stream = conn.generate(SamplingParams(max_tokens=1000), prompt="x")
                await stream.receive()  # the stream is really in flight
                pid = handle.pid
                assert pid is not None
                os.kill(pid, signal.SIGSTOP)
                t0 = time.monotonic()
                with pytest.raises(WorkerCrashed, match="hung"):
                    await collect(stream)
                detected = time.monotonic() - t0
            # The replacement starts with no request asking for it.
            await wait_for(lambda: handle.state is State.READY and handle.pid != pid, 3, "a new worker")
            replaced = time.monotonic() - t0
            # Wall clock with real processes: allow scheduling slack over the bound.
            assert detected <= replaced <= BOUND + 0.4, (detected, replaced)
            assert "hung" in (handle.last_error or "")
            assert handle.starts == 2
            text, last = await _generate_with_lease(handle, 3)
            assert text == expected_text(3) and last.finish_reason == "length"
            assert handle.pid not in (None, pid)


async def _generate_with_lease(handle, n):  # type: ignore[no-untyped-def]
    async with handle.lease() as conn:
        return await generate(conn, n)


async def test_busy_worker_answers_pings_and_is_not_killed(tmp_path, monkeypatch) -> None:
    # Two seconds of generation span ten ping intervals: pings are answered alongside.
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")
    sup = make_supervisor(tmp_path, {"m": {}}, health_interval=INTERVAL, health_misses=MISSES)
    handle = sup.resolve("m")
    with trio.fail_after(15):
        async with running(sup):
            async with handle.lease() as conn:
                pid = handle.pid
                text, last = await generate(conn, 40)
            assert text == expected_text(40) and last.finish_reason == "length"
            assert handle.pid == pid and handle.state is State.READY


async def test_health_interval_zero_disables_pings(tmp_path) -> None:
    sup = make_supervisor(tmp_path, {"m": {}}, health_interval=0)
    handle = sup.resolve("m")
    with trio.fail_after(15):
        async with running(sup):
            async with handle.lease() as conn:
                await generate(conn, 1)
            pid = handle.pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            try:
                await trio.sleep(BOUND * 3)
                assert handle.state is State.READY and handle.pid == pid
            finally:
                os.kill(pid, signal.SIGCONT)  # so the graceful stop can reach it


async def test_a_stall_of_the_routers_own_loop_kills_no_worker(tmp_path) -> None:
    """Found by the outside probe of issue 40 (N1): one request whose answer held the event
    loop for 17 s (a 200 MB upstream answer decoded in one call) made every worker look
    silent, and the supervisor killed them all as hung, breaking other keys' requests. The
    loop's own stall is not a worker's silence; a worker that really hangs is still caught
    (the test above)."""
    sup = make_supervisor(tmp_path, {"m": {}, "n": {}}, health_interval=INTERVAL, health_misses=MISSES)
    with trio.fail_after(20):
        async with running(sup):
            for name in ("m", "n"):
                async with sup.resolve(name).lease() as conn:
                    await generate(conn, 2)
            pids = {name: sup.resolve(name).pid for name in ("m", "n")}
            time.sleep(4 * BOUND)  # the loop held, as by a long synchronous call
            await trio.sleep(3 * BOUND)  # past the detection bound, with the loop free again
            for name in ("m", "n"):
                handle = sup.resolve(name)
                assert handle.state is State.READY and handle.pid == pids[name], (name, handle.last_error)
                assert handle.starts == 1
                async with handle.lease() as conn:
                    text, _ = await generate(conn, 3)
                assert text == expected_text(3)
