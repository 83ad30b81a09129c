"""What a client sees of capacity and backoff over HTTP: the real app and supervisor,
simulated workers, the virtual clock."""

from __future__ import annotations

from pathlib import Path

import trio

from router.app import create_app
from supervisor.lifecycle import State
from tests.harness import running
from tests.sim.support import sim_supervisor
from tests.sim_worker import Behaviour

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_a_request_that_finds_no_room_gets_503_with_retry_after(
    tmp_path: Path, autojump_clock: object
) -> None:
    sup, launcher = sim_supervisor(
        tmp_path, {"a": {}, "b": {}}, {"a": Behaviour(tokens_per_sec=0.01)},
        max_loaded_models=1, load_wait=20,
    )
    client = create_app(sup, sup.config).test_client()
    async with running(sup), trio.open_nursery() as nursery:
        async def busy_a() -> None:
            await client.post("/v1/chat/completions", json={**CHAT, "model": "a"})

        nursery.start_soon(busy_a)
        await sup.resolve("a").wait_for_state(State.READY)
        queued = trio.Event()

        async def look() -> None:
            while not sup.admission.queued():
                await trio.sleep(0.5)
            r = await client.get("/admin/models")
            body = await r.get_json()
            assert body["load_queue"][0]["model"] == "b"
            assert "max_loaded_models = 1" in body["load_queue"][0]["reason"]
            queued.set()

        nursery.start_soon(look)
        t0 = trio.current_time()
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "b"})
        assert trio.current_time() - t0 == 20
        assert queued.is_set()
        assert r.status_code == 503
        assert r.headers["retry-after"] == "5" and r.headers["x-should-retry"] == "true"
        err = (await r.get_json())["error"]
        assert err["code"] == "model_unavailable" and err["type"] == "server_error"
        assert "no room to load 'b'" in err["message"]
        nursery.cancel_scope.cancel()


async def test_a_request_during_backoff_gets_503_with_the_time_left(
    tmp_path: Path, autojump_clock: object
) -> None:
    sup, _ = sim_supervisor(
        tmp_path, {"a": {}}, {"a": Behaviour(exit_at_start=True)},
        backoff_base=45, load_wait=10,
    )
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "a"})
        assert r.status_code == 503
        assert r.headers["retry-after"] == "35" and r.headers["x-should-retry"] == "true"
        assert "backing off" in (await r.get_json())["error"]["message"]
