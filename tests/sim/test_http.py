"""What a client sees of capacity and backoff over HTTP: the real app and supervisor,
simulated workers, the virtual clock."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

import msgspec

import pytest
import trio

from router.app import create_app
from supervisor.lifecycle import State
from tests.harness import running
from tests.sim.support import sim_supervisor
from tests.behaviour import Behaviour

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


async def test_health_metrics_and_model_lists_never_reset_the_idle_timer(
    tmp_path: Path, autojump_clock: object
) -> None:
    sup, launcher = sim_supervisor(tmp_path, {"a": {"idle_timeout": 100}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        h = sup.resolve("a")
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "a"})
        assert r.status_code == 200
        ended = h.last_used
        for path in ("/health", "/metrics", "/v1/models", "/admin/models") * 6:
            await trio.sleep(4)  # 96 s of polling in all, right up to the deadline
            assert (await client.get(path)).status_code == 200
        assert h.state is State.READY
        await h.wait_for_state(State.STOPPED)
        assert trio.current_time() - ended == pytest.approx(100, abs=0.01)
        assert len(launcher.stops) == 1


async def test_metrics_report_each_model_in_prometheus_text(tmp_path: Path, autojump_clock: object) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {"slots": 3}, "b": {}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "a"})).status_code == 200
        r = await client.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=")
        samples = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in (await r.get_data(as_text=True)).splitlines()
            if line and not line.startswith("#")
        }
        assert samples['corral_model_state{model="a",state="ready"}'] == 1
        assert samples['corral_model_state{model="a",state="stopped"}'] == 0
        assert samples['corral_model_state{model="b",state="stopped"}'] == 1
        assert samples['corral_model_slots{model="a"}'] == 3
        assert samples['corral_model_in_flight{model="a"}'] == 0
        assert samples['corral_model_restarts_total{model="a"}'] == 0
        assert samples["corral_load_queue_length"] == 0
        assert samples["corral_config_error"] == 0
        assert 'corral_model_rss_bytes{model="b"}' not in samples  # not loaded: no worker, no RSS


async def test_admin_routes_name_a_bad_flag_and_show_one_model(tmp_path: Path, autojump_clock: object) -> None:
    """Pins aa4628e: force=maybe was read as a silent no instead of a 400 naming 'force'."""
    sup, _ = sim_supervisor(tmp_path, {"a": {"aliases": ["alpha"]}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.post("/admin/models/a/unload?force=maybe")
        assert r.status_code == 400
        err = (await r.get_json())["error"]
        assert err["param"] == "force" and "'maybe'" in err["message"]
        assert sup.resolve("a").state is State.STOPPED  # nothing happened
        r = await client.get("/admin/models/alpha")
        assert r.status_code == 200
        model = (await r.get_json())["model"]
        assert (model["name"], model["aliases"], model["state"]) == ("a", ["alpha"], "stopped")
        r = await client.get("/admin/models/nope")
        assert r.status_code == 404 and (await r.get_json())["error"]["code"] == "model_not_found"
        assert (await client.post("/admin/models/a/load")).status_code == 200
        r = await client.post("/admin/models/a/unload?force=FALSE")  # case and spelling vary
        assert r.status_code == 202
        await sup.resolve("a").wait_for_state(State.STOPPED)


async def test_admin_routes_take_model_names_with_slashes(tmp_path: Path, autojump_clock: object) -> None:
    """Pins 983ad72: the admin routes answered 404 for a model named org/model."""
    sup, launcher = sim_supervisor(tmp_path, {"org/model-7b": {}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.post("/admin/models/org/model-7b/load")
        assert r.status_code == 200 and (await r.get_json())["model"]["state"] == "ready"
        assert (await client.get("/admin/models/org/model-7b")).status_code == 200
        assert (await client.post("/admin/models/org/model-7b/unload")).status_code == 202
        await sup.resolve("org/model-7b").wait_for_state(State.STOPPED)
        r = await client.post("/admin/models/org/other/load")
        assert r.status_code == 404 and "org/other" in (await r.get_json())["error"]["message"]
        assert [spec.name for spec in launcher.starts] == ["org/model-7b"]


async def test_models_retrieve_names_the_model_of_a_name_or_an_alias_and_loads_nothing(
    tmp_path: Path, autojump_clock: object
) -> None:
    """The openai client's `models.retrieve(id)` is GET /v1/models/{id} (issue 10, item 5)."""
    sup, launcher = sim_supervisor(tmp_path, {"a": {"aliases": ["org/alias"]}, "b": {}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        for path in ("/v1/models/a", "/v1/models/org/alias", "/models/a"):
            r = await client.get(path)
            assert r.status_code == 200, path
            body = await r.get_json()
            assert body["id"] == "a" and body["object"] == "model" and body["aliases"] == ["a", "org/alias"]
            assert isinstance(body["created"], int) and body["owned_by"] == "corral"
        r = await client.get("/v1/models/nope")
        assert r.status_code == 404
        err = (await r.get_json())["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
        assert launcher.starts == []


async def test_the_openai_routes_answer_without_their_v1_prefix(tmp_path: Path, autojump_clock: object) -> None:
    """A client whose base URL has no /v1 (llama-server's routes have both forms)."""
    sup, _ = sim_supervisor(tmp_path, {"a": {}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.get("/models")
        assert [m["id"] for m in (await r.get_json())["data"]] == ["a"]
        r = await client.post("/chat/completions", json={**CHAT, "model": "a"})
        assert r.status_code == 200
        assert (await r.get_json())["object"] == "chat.completion"
        # /completions without /v1 is llama-server's native completion, as llama-server
        # routes it (llama.cpp's test_security.py test_correct_api_key reads `content`).
        r = await client.post("/completions", json={"model": "a", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200 and "content" in (await r.get_json())
        r = await client.post("/v1/completions", json={"model": "a", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200 and (await r.get_json())["object"] == "text_completion"
        # /embeddings without /v1 is llama-server's native one: its 501 for a model that
        # serves no embeddings (server-context.cpp handle_embeddings_impl).
        r = await client.post("/embeddings", json={"model": "a", "input": "x"})
        assert r.status_code == 501  # reaches the route: "a" is not an embedding model
        error = (await r.get_json())["error"]
        assert error["param"] == "model" and error["type"] == "not_supported_error"


async def test_a_request_without_a_model_goes_to_default_model(
    tmp_path: Path, autojump_clock: object
) -> None:
    """Issue 10: `[server] default_model` takes requests that name no model (or null).
    Without it they get a 400 naming `model`; an unknown name stays a 404."""
    sup, _ = sim_supervisor(tmp_path, {"a": {}, "b": {"aliases": ["gpt-4o"]}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 400
        err = (await r.get_json())["error"]
        assert err["param"] == "model" and "default_model" in err["message"]

        sup.config = dataclasses.replace(
            sup.config, server=msgspec.structs.replace(sup.config.server, default_model="gpt-4o")
        )
        for body in (CHAT, {**CHAT, "model": None}):
            r = await client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, await r.get_data()
            assert (await r.get_json())["model"] == "b"  # the model it went to
        assert sup.resolve("b").state is State.READY and sup.resolve("a").state is not State.READY
        r = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 200
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
        assert r.status_code == 404
        assert (await r.get_json())["error"]["code"] == "model_not_found"


async def test_an_empty_tools_array_is_a_chat_without_tools(tmp_path: Path, autojump_clock: object) -> None:
    """Issue 22, item 2: llama-server answers `tools: []` (with any tool_choice) as a chat
    without tools; the Ollama client and LangChain send it. Was a 400 naming `tools`."""
    sup, _ = sim_supervisor(tmp_path, {"a": {}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        plain = await client.post("/v1/chat/completions", json={**CHAT, "model": "a"})
        for choice in (None, "required", {"type": "function", "function": {"name": "f"}}):
            extra = {"tools": [], **({"tool_choice": choice} if choice is not None else {})}
            r = await client.post("/v1/chat/completions", json={**CHAT, "model": "a", **extra})
            assert r.status_code == 200, await r.get_data()
            body, want = await r.get_json(), await plain.get_json()
            assert body["choices"][0]["message"] == want["choices"][0]["message"]
            assert body["choices"][0]["finish_reason"] == "length"


async def test_health_of_one_model_is_503_while_it_cannot_serve(tmp_path: Path, autojump_clock: object) -> None:
    """/health?model=NAME for a balancer: 200 while the model can serve (an unloaded one
    loads on demand), 503 while loading, backing off (with Retry-After) or failed, 404 for
    a model it does not serve."""
    sup, _ = sim_supervisor(
        tmp_path, {"a": {"aliases": ["alpha"]}, "bad": {}, "slow": {}},
        {"bad": Behaviour(exit_at_start=True), "slow": Behaviour(load_delay=30)},
        start_retries=2, backoff_base=40, load_wait=5,
    )
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.get("/health?model=alpha")
        assert r.status_code == 200
        assert await r.get_json() == {"status": "ok", "model": "a", "state": "stopped"}
        assert (await client.get("/health?model=bad")).status_code == 200  # not tried yet
        assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "bad"})).status_code == 503
        r = await client.get("/health?model=bad")
        assert r.status_code == 503 and (await r.get_json())["state"] == "backoff"
        assert 1 <= int(r.headers["retry-after"]) <= 40
        while sup.resolve("bad").state is not State.FAILED:  # the retries run on demand
            await client.post("/v1/chat/completions", json={**CHAT, "model": "bad"})
        r = await client.get("/health?model=bad")
        assert r.status_code == 503
        assert await r.get_json() == {"status": "unavailable", "model": "bad", "state": "failed"}
        assert "retry-after" not in r.headers
        r = await client.get("/health?model=nope")
        assert r.status_code == 404
        assert "nope" in (await r.get_json())["error"]["message"]
        assert (await client.get("/health")).status_code == 200  # the server itself answers
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(client.post, "/v1/chat/completions", json={**CHAT, "model": "slow"}))
            await sup.resolve("slow").wait_for_state(State.STARTING)
            r = await client.get("/health?model=slow")
            assert r.status_code == 503 and (await r.get_json())["state"] == "starting"
        r = await client.get("/health?model=slow")
        assert r.status_code == 200 and (await r.get_json())["state"] == "ready"
        assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "a"})).status_code == 200
        r = await client.get("/health?model=a")
        assert r.status_code == 200 and (await r.get_json())["state"] == "ready"
