"""Crashes and stops as clients see them: isolation between models, HTTP mapping, and a
request that arrives while its model is stopping."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import trio

from router.app import create_app
from supervisor.errors import WorkerCrashed
from supervisor.lifecycle import State
from tests.process.support import StartLog, collect, expected_text, make_supervisor, running, wait_for
from worker.protocol import SamplingParams


async def test_kill_9_mid_stream_fails_fast_and_spares_other_models(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "50")
    sup = make_supervisor(tmp_path, {"a": {}, "b": {}}, min_uptime=0)
    a, b = sup.resolve("a"), sup.resolve("b")
    with trio.fail_after(15):
        async with running(sup):
            async with a.lease() as conn_a, b.lease() as conn_b:
                stream_a = conn_a.generate(SamplingParams(max_tokens=1000), prompt="a")
                stream_b = conn_b.generate(SamplingParams(max_tokens=40), prompt="b")
                await stream_a.receive()
                pid_a = a.pid
                assert pid_a is not None
                os.kill(pid_a, signal.SIGKILL)
                t0 = time.monotonic()
                with pytest.raises(WorkerCrashed):
                    await collect(stream_a)
                assert time.monotonic() - t0 < 1.0
                text_b, last_b = await collect(stream_b)  # b never noticed
                assert text_b == expected_text(40) and last_b.finish_reason == "length"
            await wait_for(lambda: a.state is State.STOPPED, 3, "a's crash to be handled")
            async with a.lease() as conn:
                assert (await collect(conn.generate(SamplingParams(max_tokens=2), prompt="x")))[0] == expected_text(2)
            assert a.pid not in (None, pid_a)
            assert b.crashes == 0


async def test_http_crash_is_502_or_a_final_sse_error_event(tmp_path, monkeypatch, start_log: StartLog) -> None:
    monkeypatch.setenv("FAKE_CRASH_AFTER", "3")
    sup = make_supervisor(tmp_path, {"m": {}}, min_uptime=0)
    client = create_app(sup, sup.config).test_client()
    body = {"model": "m", "prompt": "x", "max_tokens": 50}
    with trio.fail_after(15):
        async with running(sup):
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 502
            err = (await r.get_json())["error"]
            assert err["code"] == "worker_crashed" and err["type"] == "server_error"

            await wait_for(lambda: sup.resolve("m").state is State.STOPPED, 3, "the crash")
            r = await client.post("/v1/completions", json={**body, "stream": True})
            assert r.status_code == 200  # headers went out with the first token
            events = [e for e in (await r.get_data(as_text=True)).split("\n\n") if e]
            assert events[0].startswith("data: {") and "data: [DONE]" not in events
            final = json.loads(events[-1][len("data: "):])
            assert final["error"]["code"] == "worker_crashed"


async def test_request_while_stopping_waits_then_starts_again(tmp_path, monkeypatch, start_log: StartLog) -> None:
    """Pins the race of llama-swap #946, which deadlocked there: a request that arrives while
    an idle (TTL) stop is under way must wait for that stop and then start a fresh worker,
    not wait for a ready signal the stopping worker never sends (added in 60123f4)."""
    # The worker ignores Shutdown, so its idle stop takes stop_grace + 1 s before SIGTERM.
    monkeypatch.setenv("FAKE_IGNORE_SHUTDOWN", "1")
    sup = make_supervisor(tmp_path, {"m": {}}, idle_timeout=0.2, stop_grace=0.5)
    h = sup.resolve("m")
    with trio.fail_after(15):
        async with running(sup):
            async with h.lease():
                pid = h.pid
            await wait_for(lambda: h.state is State.STOPPING, 3, "the idle stop")
            async with h.lease() as conn:  # arrives mid-stop: waits, then a fresh start
                assert h.state is State.READY
                assert (await collect(conn.generate(SamplingParams(max_tokens=2), prompt="x")))[0] == expected_text(2)
            assert h.pid not in (None, pid)
            assert len(start_log.entries()) == 2


async def test_a_request_that_crashes_every_worker_never_makes_the_model_failed_for_everyone(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    # Issue 40: four restores of a bad slot file in a row, each crashing a fresh worker
    # within min_uptime, left the model `failed` (503, x-should-retry: false) for every key.
    # A worker that dies serving a request was killed by it, not by a failed start (one
    # that dies by itself within min_uptime still is: tests/sim/test_transitions.py).
    monkeypatch.setenv("FAKE_CRASH_AFTER", "2")  # any request for more than 2 tokens kills it
    sup = make_supervisor(tmp_path, {"m": {}}, min_uptime=60, start_retries=2, backoff_base=0.1)
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(30):
        async with running(sup):
            m = sup.resolve("m")
            for _ in range(5):
                r = await client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 20})
                assert r.status_code == 502 and (await r.get_json())["error"]["code"] == "worker_crashed"
                await wait_for(lambda: m.state is not State.READY, 3, "the crash")
                assert m.state is State.STOPPED, m.state
            assert m.crashes == 5 and m.failures == 0
            r = await client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1})
            assert r.status_code == 200, await r.get_data()
