"""/admin/models and load / unload / reset, plus preload and pinned, through the real app
and supervisor (Quart's test client; fake workers)."""

from __future__ import annotations

import pytest
import trio

from router.app import create_app
from supervisor.errors import WorkerCrashed
from supervisor.lifecycle import State
from tests.process.support import (
    StartLog,
    collect,
    expected_text,
    make_supervisor,
    running,
    wait_for,
)
from worker.protocol import SamplingParams

FIELDS = {
    "name", "aliases", "state", "pid", "rss_bytes", "slots", "slots_busy", "queued", "waiting",
    "waiting_by_priority", "in_flight", "last_used", "load_seconds", "restarts", "last_error", "pinned",
    "cost_bytes", "threads", "loaded", "prompt_tokens_decoded", "kv_cells_used",
    "kv_repairs", "kv_prefixes_refused", "requests_per_minute",
    "tokens_generated", "prompt_cache", "modalities", "lora",
}


def _app(sup):  # type: ignore[no-untyped-def]
    return create_app(sup, sup.config).test_client()


async def _models(client) -> dict[str, dict[str, object]]:  # type: ignore[no-untyped-def]
    r = await client.get("/admin/models")
    assert r.status_code == 200
    return {m["name"]: m for m in (await r.get_json())["models"]}


async def test_admin_models_load_and_fields(tmp_path, start_log: StartLog) -> None:
    sup = make_supervisor(tmp_path, {"chat": {"aliases": ["c"], "slots": 3}})
    client = _app(sup)
    with trio.fail_after(15):
        async with running(sup):
            before = (await _models(client))["chat"]
            assert set(before) == FIELDS
            assert before["state"] == "stopped" and before["pid"] is None and before["rss_bytes"] is None
            assert before["aliases"] == ["c"] and before["slots"] == 3 and before["pinned"] is False

            r = await client.post("/admin/models/c/load")  # by alias
            assert r.status_code == 200
            after = (await r.get_json())["model"]
            assert after["state"] == "ready"
            assert isinstance(after["pid"], int) and after["rss_bytes"] > 1_000_000
            assert after["load_seconds"] >= 0 and after["restarts"] == 0
            # What the worker said in Ready, for the operator (the fake's own figures).
            assert before["loaded"] is None
            loaded = after["loaded"]
            assert loaded["n_ctx_train"] == 32768 and loaded["n_vocab"] == 32000
            assert loaded["n_embd"] == 16 and loaded["has_template"] is True
            assert loaded["n_ctx_slot"] > 0 and loaded["description"] == "fake worker for chat"
            assert len(start_log.entries()) == 1

            r = await client.post("/admin/models/nope/load")
            assert r.status_code == 404
            assert (await r.get_json())["error"]["code"] == "model_not_found"


async def test_graceful_unload_lets_the_stream_finish(tmp_path, monkeypatch, start_log: StartLog) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "50")
    sup = make_supervisor(tmp_path, {"chat": {}})
    h = sup.resolve("chat")
    client = _app(sup)
    with trio.fail_after(15):
        async with running(sup):
            async with h.lease() as conn:
                proc = conn.process
                stream = conn.generate(SamplingParams(max_tokens=20), prompt="x")
                r = await client.post("/admin/models/chat/unload")
                assert r.status_code == 202
                assert h.state is State.DRAINING
                text, last = await collect(stream)  # finishes untouched
                assert text == expected_text(20) and last.finish_reason == "length"
            await wait_for(lambda: h.state is State.STOPPED, 5, "the drained worker to stop")
            assert proc is not None and proc.returncode == 0


async def test_forced_unload_cancels_requests_in_flight(tmp_path, monkeypatch, start_log: StartLog) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "50")
    sup = make_supervisor(tmp_path, {"chat": {}})
    h = sup.resolve("chat")
    client = _app(sup)
    with trio.fail_after(15):
        async with running(sup):
            with pytest.raises(WorkerCrashed, match="unloaded"):
                async with h.lease() as conn:
                    stream = conn.generate(SamplingParams(max_tokens=10_000), prompt="x")
                    await stream.receive()
                    r = await client.post("/admin/models/chat/unload?force=true")
                    assert r.status_code == 202
                    await collect(stream)
            await wait_for(lambda: h.state is State.STOPPED, 5, "the forced unload")


async def test_failed_model_is_503_without_retry_until_reset(tmp_path, monkeypatch, start_log: StartLog) -> None:
    monkeypatch.setenv("FAKE_FAIL_LOAD", "bad magic")
    sup = make_supervisor(tmp_path, {"chat": {}}, start_retries=0)
    client = _app(sup)
    body = {"model": "chat", "prompt": "x", "max_tokens": 2}
    with trio.fail_after(15):
        async with running(sup):
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 503
            assert r.headers["x-should-retry"] == "false"
            assert "bad magic" in (await r.get_json())["error"]["message"]
            info = (await _models(client))["chat"]
            assert info["state"] == "failed" and "bad magic" in str(info["last_error"])

            monkeypatch.delenv("FAKE_FAIL_LOAD")
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 503  # still failed: a fixed file alone does not retry

            r = await client.post("/admin/models/chat/reset")
            assert (await r.get_json())["reset"] is True
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 200
            assert (await r.get_json())["choices"][0]["text"] == expected_text(2)


async def test_preload_loads_at_start_and_pinned_never_idles_out(tmp_path, start_log: StartLog) -> None:
    sup = make_supervisor(
        tmp_path,
        {"pre": {"preload": True, "pinned": True, "idle_timeout": 0.2}, "lazy": {"idle_timeout": 0.2}},
    )
    with trio.fail_after(15):
        async with running(sup):
            pre, lazy = sup.resolve("pre"), sup.resolve("lazy")
            await wait_for(lambda: pre.state is State.READY, 5, "preload")
            assert lazy.state is State.STOPPED
            async with lazy.lease():
                pass
            await wait_for(lambda: lazy.state is State.STOPPED, 5, "lazy to idle out")
            await trio.sleep(0.5)  # well past pre's idle_timeout
            assert pre.state is State.READY


async def test_admin_reload_reports_the_diff_or_every_problem(tmp_path, start_log: StartLog) -> None:
    from supervisor.config import load
    from supervisor.supervisor import Supervisor
    from tests.process.support import WORKER_COMMAND
    from tests.process.test_reload import write_config

    cfg = write_config(tmp_path / "config.toml", {"a": {}})
    sup = Supervisor(load(cfg), worker_command=WORKER_COMMAND)
    client = _app(sup)
    with trio.fail_after(15):
        async with running(sup):
            write_config(cfg, {"a": {}, "b": {}})
            r = await client.post("/admin/reload")
            assert r.status_code == 200
            assert (await r.get_json())["added"] == ["b"]
            assert set(await _models(client)) == {"a", "b"}

            cfg.write_text(cfg.read_text() + "bogus = 1\n")
            r = await client.post("/admin/reload")
            assert r.status_code == 400
            err = (await r.get_json())["error"]
            assert err["code"] == "invalid_config" and "models.b.bogus: unknown key" in err["message"]
            r = await client.get("/admin/models")
            assert "models.b.bogus" in (await r.get_json())["config_error"]



async def test_slots_busy_agrees_with_in_flight_during_and_after_a_burst(
    tmp_path, monkeypatch, start_log: StartLog
) -> None:
    """Issue 8, finding 8: right after 300 clients finished, /admin/models said
    slots_busy 3 with in_flight 0 for about 3 s, because slots_busy came only with the next
    Pong. The worker now reports its occupancy whenever it changes."""
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")
    sup = make_supervisor(tmp_path, {"m": {"slots": 2}}, health_interval=30)  # no ping helps
    client = _app(sup)

    async def counts() -> tuple[object, object, object]:
        m = (await _models(client))["m"]
        return m["in_flight"], m["slots_busy"], m["queued"]

    with trio.fail_after(20):
        async with running(sup):
            h = sup.resolve("m")

            async def one_request() -> None:
                async with h.lease() as conn:
                    await collect(conn.generate(SamplingParams(max_tokens=10), prompt="x"))

            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(one_request)
                await wait_for(lambda: h.in_flight == 6, 5, "six requests in flight")
                await trio.sleep(0.2)  # a few decode steps: the counts have arrived
                assert await counts() == (6, 2, 4)
            # The last request has just finished: the counts say so at once.
            await trio.sleep(0.05)
            assert await counts() == (0, 0, 0)
