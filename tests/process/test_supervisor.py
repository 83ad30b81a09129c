"""The real Supervisor and ModelHandle driving real worker processes (tests/fake_worker.py).

Every test runs under trio.fail_after, so a lifecycle bug fails the test instead of hanging
the suite; the autouse `start_log` fixture (conftest.py) also fails any test that leaves a
worker process running.
"""

from __future__ import annotations

import signal

import pytest
import trio

from supervisor.errors import ModelNotFound, Unsupported, WorkerCrashed, WorkerUnavailable
from supervisor.lifecycle import State
from tests.process.support import (
    StartLog,
    alive,
    collect,
    expected_text,
    generate,
    make_supervisor,
    running,
    wait_for,
)
from worker.protocol import SamplingParams


# ---- lazy start -------------------------------------------------------------------------------


async def test_no_worker_runs_before_the_first_request(tmp_path, start_log: StartLog) -> None:
    sup = make_supervisor(tmp_path, {"chat": {}, "emb": {"embeddings": True}})
    with trio.fail_after(10):
        async with running(sup):
            await trio.sleep(0.3)  # time enough for an eager start to show up
            for h in sup.handles.values():
                assert h.state is State.STOPPED
                assert h.pid is None
                assert h.conn is None
                assert h.starts == 0
            assert start_log.entries() == []

            # The first request is what starts a worker, and only for its model.
            async with sup.resolve("chat").lease() as conn:
                assert conn.ready is not None
                text, _ = await generate(conn, 2)
            assert text == expected_text(2)
            assert start_log.names() == ["chat"]
            assert sup.handles["emb"].state is State.STOPPED
            assert sup.handles["emb"].pid is None


async def test_ten_concurrent_first_requests_start_one_worker(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_LOAD_DELAY", "0.3")  # every request arrives while it loads
    sup = make_supervisor(tmp_path, {"chat": {"slots": 4}})
    handle = sup.resolve("chat")
    results: list[tuple[int, int | None, str, str | None]] = []

    async def one(i: int) -> None:
        async with handle.lease() as conn:
            text, last = await generate(conn, 3, prompt=f"request {i}")
            pid = conn.process.pid if conn.process else None
            results.append((id(conn), pid, text, last.finish_reason))

    with trio.fail_after(15):
        async with running(sup):
            async with trio.open_nursery() as nursery:
                for i in range(10):
                    nursery.start_soon(one, i)
                await wait_for(lambda: handle.state is State.STARTING, 5, "STARTING")
                assert handle.pid is None  # not Ready yet; all ten are waiting
            assert len(results) == 10
            assert len({conn for conn, *_ in results}) == 1
            assert {pid for _, pid, *_ in results} == {handle.pid}
            assert all(text == expected_text(3) for *_, text, _ in results)
            assert all(reason == "length" for *_, reason in results)
            assert handle.starts == 1
            assert start_log.entries() == [("chat", handle.pid)]
            assert handle.in_flight == 0
            assert handle.state is State.READY


async def test_alias_resolves_to_the_same_handle_and_worker(tmp_path, start_log: StartLog) -> None:
    sup = make_supervisor(tmp_path, {"chat": {"aliases": ["gpt-4o", "assistant"]}, "other": {}})
    h = sup.resolve("chat")
    assert sup.resolve("gpt-4o") is h
    assert sup.resolve("assistant") is h
    assert sup.resolve("other") is not h
    with pytest.raises(ModelNotFound) as exc:
        sup.resolve("gpt-5")
    assert exc.value.param == "model"

    with trio.fail_after(10):
        async with running(sup):
            pids = []
            for name in ["gpt-4o", "chat", "assistant"]:
                async with sup.resolve(name).lease() as conn:
                    text, _ = await generate(conn, 2)
                    assert text == expected_text(2)
                    pids.append(conn.process.pid if conn.process else None)
            assert len(set(pids)) == 1 and pids[0] is not None
            assert h.starts == 1
            assert start_log.entries() == [("chat", pids[0])]
            assert sup.handles["other"].state is State.STOPPED


async def test_three_models_start_one_worker_each(tmp_path, start_log: StartLog) -> None:
    sup = make_supervisor(
        tmp_path, {"chat-a": {}, "chat-b": {"slots": 2}, "embed": {"embeddings": True}}
    )

    async def chat(name: str) -> None:
        async with sup.resolve(name).lease() as conn:
            text, last = await generate(conn, 4)
            assert text == expected_text(4)
            assert last.usage is not None and last.usage.completion_tokens == 4

    vectors: dict[str, list[float]] = {}

    async def embed(text: str) -> None:
        async with sup.resolve("embed").lease() as conn:
            result = await conn.embed([text])
            assert conn.ready is not None
            assert len(result.data) == 1 and len(result.data[0]) == conn.ready.n_embd
            vectors[text] = result.data[0]

    with trio.fail_after(15):
        async with running(sup):
            async with trio.open_nursery() as nursery:
                for name in ["chat-a", "chat-b", "chat-a", "chat-b"]:
                    nursery.start_soon(chat, name)
                nursery.start_soon(embed, "first")
                nursery.start_soon(embed, "second")
            assert sorted(start_log.names()) == ["chat-a", "chat-b", "embed"]
            pids = {name: h.pid for name, h in sup.handles.items()}
            assert len(set(pids.values())) == 3 and None not in pids.values()
            assert dict(start_log.entries()) == pids
            assert vectors["first"] != vectors["second"]

            # Second round: the same three workers serve, nothing new starts.
            for name in ["chat-a", "chat-b"]:
                await chat(name)
            async with sup.resolve("embed").lease() as conn:
                again = await conn.embed(["first", "second"])
                assert again.data == [vectors["first"], vectors["second"]]  # deterministic
                # The kind of model is enforced by the worker and mapped to Unsupported.
                with pytest.raises(Unsupported):
                    await collect(conn.generate(SamplingParams(max_tokens=2), prompt="hi"))
            async with sup.resolve("chat-a").lease() as conn:
                with pytest.raises(Unsupported):
                    await conn.embed(["x"])
            assert len(start_log.entries()) == 3
            assert {name: h.pid for name, h in sup.handles.items()} == pids
            assert all(h.starts == 1 for h in sup.handles.values())


# ---- idle unload --------------------------------------------------------------------------------


async def test_idle_worker_stops_after_its_idle_timeout(tmp_path, start_log: StartLog) -> None:
    # [supervisor] idle_timeout is the default; a model can override it, 0 = never unload.
    sup = make_supervisor(
        tmp_path, {"quick": {}, "forever": {"idle_timeout": 0}}, idle_timeout=0.5
    )
    quick, forever = sup.resolve("quick"), sup.resolve("forever")
    with trio.fail_after(15):
        async with running(sup):
            async with forever.lease() as conn:
                await generate(conn)
            async with quick.lease() as conn:
                await generate(conn)
                proc = conn.process
                assert proc is not None
            released = trio.current_time()

            await trio.sleep(0.25)
            if trio.current_time() - released < 0.45:  # else the machine stalled: no verdict
                assert quick.state is State.READY, "stopped before idle_timeout passed"
                assert alive(proc.pid)

            await wait_for(lambda: quick.state is State.STOPPED, 5, "idle stop")
            assert trio.current_time() - released >= 0.45
            assert proc.returncode == 0  # stopped with Shutdown, not killed
            assert quick.pid is None and quick.conn is None
            assert quick.crashes == 0
            assert not alive(proc.pid)
            assert forever.state is State.READY  # idle_timeout = 0 never unloads

            # The next request loads it again, in a new process.
            async with quick.lease() as conn:
                text, _ = await generate(conn, 2)
                assert text == expected_text(2)
                assert conn.process is not None and conn.process.pid != proc.pid
            assert quick.starts == 2
            assert start_log.names().count("quick") == 2
            assert forever.starts == 1


async def test_held_lease_keeps_the_worker_past_idle_timeout(tmp_path, start_log: StartLog) -> None:
    sup = make_supervisor(tmp_path, {"chat": {}}, idle_timeout=0.4)
    h = sup.resolve("chat")
    with trio.fail_after(15):
        async with running(sup):
            lease = await h.acquire()
            proc = lease.conn.process
            assert proc is not None
            await trio.sleep(1.2)  # three idle timeouts with a lease held
            assert h.state is State.READY
            assert h.in_flight == 1
            assert proc.returncode is None and h.pid == proc.pid
            text, _ = await generate(lease.conn, 2)  # and it still serves
            assert text == expected_text(2)
            lease.release()
            lease.release()  # idempotent: must not drive in_flight negative
            assert h.in_flight == 0
            released = trio.current_time()
            await wait_for(lambda: h.state is State.STOPPED, 5, "idle stop after release")
            assert trio.current_time() - released >= 0.35
            assert proc.returncode == 0
            assert h.starts == 1


async def test_long_stream_is_not_cut_by_idle_timeout(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "10")  # 12 tokens: 1.2 s, three idle timeouts
    sup = make_supervisor(tmp_path, {"chat": {}}, idle_timeout=0.4)
    h = sup.resolve("chat")
    with trio.fail_after(15):
        async with running(sup):
            async with h.lease() as conn:
                text, last = await generate(conn, 12)
            assert text == expected_text(12)
            assert last.finish_reason == "length"
            assert h.crashes == 0 and h.starts == 1
            await wait_for(lambda: h.state is State.STOPPED, 5, "idle stop after the stream")


# ---- crashes and failed loads -------------------------------------------------------------------


async def test_crash_mid_stream_fails_the_stream_and_next_request_restarts(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_CRASH_AFTER", "2")
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "10")
    sup = make_supervisor(tmp_path, {"chat": {}})
    h = sup.resolve("chat")
    with trio.fail_after(15):
        async with running(sup):
            lease = await h.acquire()
            proc = lease.conn.process
            assert proc is not None
            stream = lease.conn.generate(SamplingParams(max_tokens=50), prompt="go")
            texts = []
            with pytest.raises(WorkerCrashed):
                async for ev in stream:
                    texts.append(ev.text)
                    last_token_at = trio.current_time()
            # The crash comes one step (0.1 s) after the second token; a reader that missed
            # the EOF would only be noticed by the fail_after above.
            assert trio.current_time() - last_token_at < 1.5
            assert texts == ["tok0", " tok1"]
            stream.close()
            lease.release()

            await wait_for(lambda: h.state is State.STOPPED, 5, "STOPPED after the crash")
            assert h.crashes == 1
            assert h.last_error
            # STOPPED is set on the socket's EOF; the process is reaped as the lifetime ends.
            await wait_for(lambda: proc.returncode is not None, 3, "the crashed worker reaped")
            assert proc.returncode == 1
            assert h.in_flight == 0
            # The old connection refuses new work instead of hanging.
            with pytest.raises(WorkerCrashed):
                lease.conn.generate(SamplingParams(max_tokens=1), prompt="x")

            monkeypatch.delenv("FAKE_CRASH_AFTER")
            monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "200")
            async with h.lease() as conn:
                text, _ = await generate(conn, 5)
                new_pid = conn.process.pid if conn.process else None
            assert text == expected_text(5)
            assert new_pid is not None and new_pid != proc.pid
            assert h.starts == 2
            assert start_log.pids("chat") == [proc.pid, new_pid]


async def test_crash_fails_every_stream_in_flight(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_CRASH_AFTER", "5")
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")
    sup = make_supervisor(tmp_path, {"chat": {"slots": 4}})
    h = sup.resolve("chat")
    outcomes: list[str] = []

    async def one() -> None:
        async with h.lease() as conn:
            try:
                await generate(conn, 100)
                outcomes.append("finished")
            except WorkerCrashed:
                outcomes.append("crashed")

    with trio.fail_after(15):
        async with running(sup):
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(one)
            assert outcomes == ["crashed"] * 3
            await wait_for(lambda: h.state is State.STOPPED, 5, "STOPPED after the crash")
            assert h.crashes == 1
            assert h.in_flight == 0


async def test_failed_loads_back_off_then_fail_every_waiter_without_retry(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_LOAD_DELAY", "0.2")
    monkeypatch.setenv("FAKE_FAIL_LOAD", "tensor 'blk.0.attn_q' has the wrong shape")
    sup = make_supervisor(tmp_path, {"chat": {}}, start_retries=1, backoff_base=0.2)
    h = sup.resolve("chat")
    errors: list[BaseException] = []

    async def one() -> None:
        try:
            lease = await h.acquire()
        except WorkerUnavailable as exc:
            errors.append(exc)
        else:  # pragma: no cover - a failure of the test, reported below
            lease.release()
            errors.append(AssertionError("acquire() succeeded on a failed load"))

    with trio.fail_after(15):
        async with running(sup):
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(one)
            # The five waiters shared the first load and its one retry after backoff.
            assert h.starts == 2 and len(start_log.entries()) == 2
            assert h.state is State.FAILED
            assert len(errors) == 5
            for exc in errors:
                assert isinstance(exc, WorkerUnavailable)
                assert exc.retry is False
                assert "wrong shape" in exc.message and "chat" in exc.message
            assert h.in_flight == 0

            # While failed, a request is refused at once and nothing is spawned.
            with pytest.raises(WorkerUnavailable) as refused:
                await h.acquire()
            assert refused.value.retry is False
            assert h.starts == 2

            # A reset lets the next request try again; this time the load works.
            monkeypatch.delenv("FAKE_FAIL_LOAD")
            assert await h.reset() and h.state is State.STOPPED
            async with h.lease() as conn:
                text, _ = await generate(conn, 2)
            assert text == expected_text(2)
            assert h.starts == 3 and h.state is State.READY


async def test_transient_load_failure_is_retried_after_backoff(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_FAIL_LOAD", "out of memory")
    sup = make_supervisor(tmp_path, {"chat": {}}, start_retries=3, backoff_base=0.5)
    h = sup.resolve("chat")
    with trio.fail_after(15):
        async with running(sup):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_lease_and_generate, h)
                await wait_for(lambda: h.state is State.BACKOFF, 5, "the first failure")
                monkeypatch.delenv("FAKE_FAIL_LOAD")  # the next start will succeed
                t0 = trio.current_time()
            # The waiter rode through the backoff and got the second worker.
            assert trio.current_time() - t0 >= 0.3
            assert h.starts == 2 and h.state is State.READY


async def _lease_and_generate(h) -> None:  # type: ignore[no-untyped-def]
    async with h.lease() as conn:
        text, _ = await generate(conn, 2)
    assert text == expected_text(2)


async def test_worker_that_exits_at_start_fails_the_load(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_EXIT_AT_START", "1")
    sup = make_supervisor(tmp_path, {"chat": {}}, start_retries=0)  # the first failure is final
    h = sup.resolve("chat")
    with trio.fail_after(10):
        async with running(sup):
            with pytest.raises(WorkerUnavailable) as exc:
                await h.acquire()
            assert "exit code 3" in exc.value.message
            assert h.state is State.FAILED
            assert len(start_log.entries()) == 1


async def test_start_timeout_fails_a_slow_load_and_kills_it(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_LOAD_DELAY", "30")
    sup = make_supervisor(tmp_path, {"chat": {}}, start_timeout=0.5, start_retries=0)
    h = sup.resolve("chat")
    with trio.fail_after(15):
        async with running(sup):
            t0 = trio.current_time()
            with pytest.raises(WorkerUnavailable) as exc:
                await h.acquire()
            elapsed = trio.current_time() - t0
            assert 0.4 <= elapsed < 3.0
            assert "start_timeout" in exc.value.message
            assert h.state is State.FAILED
            [(_, pid)] = start_log.entries()
            await wait_for(lambda: not alive(pid), 3, "the slow worker to be killed")

            # After a reset, a request with a worker that loads in time succeeds.
            monkeypatch.setenv("FAKE_LOAD_DELAY", "0")
            assert await h.reset()
            async with h.lease() as conn:
                text, _ = await generate(conn, 1)
            assert text == expected_text(1)
            assert h.starts == 2


# ---- cancellation -----------------------------------------------------------------------------


async def test_closing_a_stream_cancels_it_in_the_worker(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    # One slot: while the cancelled request held it, nothing else could run. Its 10000
    # tokens at 50/s would take 200 s, so the next request finishing at all proves that the
    # worker received the Cancel and freed the slot.
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "50")
    sup = make_supervisor(tmp_path, {"chat": {"slots": 1}})
    h = sup.resolve("chat")
    with trio.fail_after(15):
        async with running(sup):
            async with h.lease() as conn:
                pid = conn.process.pid if conn.process else None
                stream = conn.generate(SamplingParams(max_tokens=10_000), prompt="long")
                seen = [(await stream.receive()) for _ in range(3)]
                assert [getattr(ev, "text", None) for ev in seen] == ["tok0", " tok1", " tok2"]
                stream.close()
                stream.close()  # idempotent
                assert conn.in_flight == 0

                # A client that goes away mid-read: cancelled, then closed in `finally`.
                stream2 = conn.generate(SamplingParams(max_tokens=10_000), prompt="long")
                with trio.move_on_after(0.2):
                    try:
                        async for _ in stream2:
                            pass
                    finally:
                        stream2.close()

                with trio.fail_after(3):
                    text, last = await generate(conn, 3)
                assert text == expected_text(3)
                assert last.finish_reason == "length"
                assert not conn.closed.is_set()
            assert h.pid == pid and alive(pid)
            assert h.crashes == 0 and h.starts == 1
            assert h.in_flight == 0


# ---- stopping ---------------------------------------------------------------------------------


async def test_shutdown_stops_every_worker(tmp_path, monkeypatch, start_log: StartLog) -> None:
    monkeypatch.setenv("FAKE_LOAD_DELAY__slow", "30")  # still loading at shutdown
    sup = make_supervisor(tmp_path, {"chat": {}, "emb": {"embeddings": True}, "slow": {}})
    waiter_error: list[BaseException] = []

    async def wait_for_slow() -> None:
        try:
            lease = await sup.resolve("slow").acquire()
            lease.release()
        except WorkerUnavailable as exc:
            waiter_error.append(exc)

    with trio.fail_after(15):
        async with trio.open_nursery() as outer:
            async with trio.open_nursery() as nursery:
                await nursery.start(sup.run)
                async with sup.resolve("chat").lease() as conn:
                    await generate(conn)
                    chat_proc = conn.process
                async with sup.resolve("emb").lease() as conn:
                    await conn.embed(["x"])
                    emb_proc = conn.process
                outer.start_soon(wait_for_slow)
                await wait_for(lambda: len(start_log.entries()) == 3, 5, "slow to spawn")
                assert sup.resolve("slow").state is State.STARTING
                assert chat_proc is not None and emb_proc is not None
                assert alive(chat_proc.pid) and alive(emb_proc.pid)
                t0 = trio.current_time()
                nursery.cancel_scope.cancel()
            assert trio.current_time() - t0 < 5.0
            # Hard cancellation kills the workers; every one has exited and been reaped.
            assert chat_proc.returncode is not None
            assert emb_proc.returncode is not None
            for _, pid in start_log.entries():
                await wait_for(lambda: not alive(pid), 3, f"worker {pid} to exit")
            # ade1d61: a cancelled load stayed STARTING (its Cancelled came in an exception group).
            for h in sup.handles.values():
                assert h.state is State.STOPPED, h.name
                assert h.pid is None
        assert len(waiter_error) == 1
        assert "shutting down" in str(waiter_error[0])


async def test_shutdown_stops_ready_workers_gracefully(tmp_path, start_log: StartLog) -> None:
    """Pins ade1d61: cancelling Supervisor.run cancelled each worker's reader and writer, so
    the Shutdown frame never went out and every worker was SIGKILLed."""
    sup = make_supervisor(tmp_path, {"chat": {}})
    with trio.fail_after(15):
        async with running(sup):
            async with sup.resolve("chat").lease() as conn:
                await generate(conn, 1)
                proc = conn.process
        assert proc is not None
        assert proc.returncode == 0  # exited on Shutdown; -9 means it was killed


async def test_graceful_stop_abandons_a_load_in_progress(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    # A model still loading at shutdown must not hold the process up for its whole load:
    # its waiters get WorkerUnavailable at once and the half-loaded worker is killed.
    monkeypatch.setenv("FAKE_LOAD_DELAY", "30")
    sup = make_supervisor(tmp_path, {"slow": {}})
    errors: list[WorkerUnavailable] = []

    async def waiter() -> None:
        try:
            await sup.resolve("slow").acquire()
        except WorkerUnavailable as exc:
            errors.append(exc)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            nursery.start_soon(waiter)
            await wait_for(lambda: len(start_log.entries()) == 1, 5, "slow to spawn")
            t0 = trio.current_time()
            await sup.stop()
            assert trio.current_time() - t0 < 3.0
        handle = sup.resolve("slow")
        assert handle.state is State.STOPPED
        assert len(errors) == 1 and "shutting down" in str(errors[0])
        (_, pid), = start_log.entries()
        await wait_for(lambda: not alive(pid), 3, "half-loaded worker to exit")


async def test_stop_escalates_to_sigterm_and_sigkill(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    # "deaf" ignores Shutdown; "stubborn" ignores Shutdown and SIGTERM.
    monkeypatch.setenv("FAKE_IGNORE_SHUTDOWN", "1")
    monkeypatch.setenv("FAKE_IGNORE_SIGTERM__stubborn", "1")
    sup = make_supervisor(tmp_path, {"deaf": {}, "stubborn": {}}, idle_timeout=0.2, stop_grace=0.2)
    with trio.fail_after(15):
        async with running(sup):
            procs = {}
            for name in ["deaf", "stubborn"]:
                async with sup.resolve(name).lease() as conn:
                    await generate(conn, 1)
                    procs[name] = conn.process
            for name in ["deaf", "stubborn"]:
                h = sup.handles[name]
                await wait_for(lambda: h.state is State.STOPPED, 6, f"{name} stopped")
            assert procs["deaf"].returncode == -signal.SIGTERM
            assert procs["stubborn"].returncode == -signal.SIGKILL



async def test_crash_after_min_uptime_is_not_a_failed_start(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    monkeypatch.setenv("FAKE_CRASH_AFTER", "1")
    sup = make_supervisor(tmp_path, {"chat": {}}, min_uptime=0, start_retries=0)
    h = sup.resolve("chat")
    with trio.fail_after(15):
        async with running(sup):
            for _ in range(3):  # with start_retries = 0, one counted failure would fail it
                with pytest.raises(WorkerCrashed):
                    async with h.lease() as conn:
                        await generate(conn, 5)
                await wait_for(lambda: h.state is State.STOPPED, 3, "the crash to be noticed")
            assert h.failures == 0 and h.crashes == 3
