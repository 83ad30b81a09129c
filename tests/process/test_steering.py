"""Issue 40, finding 5: ordinary keys must not steer the server. Through the real app and
supervisor (fake workers): llama-server's POST /models/unload and Ollama's keep_alive are an
admin key's once keys are configured, GET /slots shows another key's running request as
busy and nothing more, and with API keys but no admin key, /admin and /metrics answer no
one (keyless loopback clients included) until the config says so."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from router.app import create_app
from supervisor.config import parse
from supervisor.lifecycle import State
from supervisor.supervisor import Supervisor
from tests.harness import config_text, running, write_config, write_gguf
from tests.process.support import WORKER_COMMAND, corral, err, serving_http, wait_for
from tests.secrets import secret

ALICE = secret("steer-alice")
BOB = secret("steer-bob")
ADMIN = secret("steer-admin")
REMOTE = {"client": ("10.1.2.3", 40000)}
HI = [{"role": "user", "content": "hello there"}]


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _supervisor(tmp_path: Path, models: dict[str, dict[str, object]], **server: object) -> Supervisor:
    write_gguf(tmp_path / "dummy.gguf")
    cfg = parse(config_text(models, server), tmp_path)
    return Supervisor(cfg, worker_command=WORKER_COMMAND)


def _keyed(tmp_path: Path, models: dict[str, dict[str, object]], **server: object) -> Supervisor:
    keys = [{"key": ALICE, "name": "alice"}, {"key": BOB, "name": "bob"}]
    return _supervisor(tmp_path, models, api_keys=keys, admin_keys=[ADMIN], **server)


async def test_post_models_unload_needs_an_admin_key_and_loading_stays_open(tmp_path: Path) -> None:
    sup = _keyed(tmp_path, {"a": {}})
    client = create_app(sup, sup.config).test_client()
    handle = sup.handles["a"]
    with trio.fail_after(30):
        async with running(sup):
            r = await client.post("/models/load", json={"model": "a"}, headers=_bearer(ALICE), scope_base=REMOTE)
            assert r.status_code == 200 and handle.state is State.READY
            r = await client.post("/models/unload", json={"model": "a"}, headers=_bearer(ALICE), scope_base=REMOTE)
            assert r.status_code == 403
            error = (await r.get_json())["error"]  # llama-server's shape
            assert (error["code"], error["type"]) == (403, "permission_error")
            assert "admin key" in error["message"]
            await trio.sleep(0.2)
            assert handle.state is State.READY
            # Loading on demand stays open to any key that may use the model.
            r = await client.post(
                "/v1/chat/completions", json={"model": "a", "messages": HI, "max_tokens": 2},
                headers=_bearer(BOB), scope_base=REMOTE,
            )
            assert r.status_code == 200
            r = await client.post("/models/unload", json={"model": "a"}, headers=_bearer(ADMIN), scope_base=REMOTE)
            assert r.status_code == 200
            await wait_for(lambda: handle.state is State.STOPPED, 10, "the admin's unload")


async def test_an_api_keys_ollama_keep_alive_neither_unloads_nor_pins_the_model(tmp_path: Path) -> None:
    sup = _keyed(tmp_path, {"a": {}, "e": {"embeddings": True}})  # idle_timeout: 600, the default
    client = create_app(sup, sup.config).test_client()
    handle = sup.handles["a"]
    post = partial(_ollama, client)
    with trio.fail_after(30):
        async with running(sup):
            # The unload form (nothing to answer, keep_alive 0) is an admin key's: a 403 in
            # Ollama's shape naming keep_alive, on every route that has one.
            for path, body in (
                ("/api/chat", {"model": "a", "messages": [], "keep_alive": 0}),
                ("/api/generate", {"model": "a", "keep_alive": "0s"}),
                ("/api/embed", {"model": "e", "input": [], "keep_alive": 0}),
                ("/api/embeddings", {"model": "e", "prompt": "", "keep_alive": 0}),
            ):
                status, got = await post(path, ALICE, **body)
                assert status == 403, (path, got)
                assert isinstance(got["error"], str) and "keep_alive" in got["error"] and "admin key" in got["error"]
            # Loading with nothing to answer stays open; for ever is cut to the config's
            # bound, by default the model's idle_timeout.
            status, got = await post("/api/chat", ALICE, model="a", messages=[], keep_alive=-1)
            assert (status, got["done_reason"]) == (200, "load") and handle.keep_alive == 600
            # A chat's keep_alive 0 does not unload the model early: it idles as configured.
            status, got = await post("/api/chat", ALICE, model="a", messages=HI, keep_alive=0)
            assert status == 200 and handle.keep_alive == 600
            await trio.sleep(0.3)
            assert handle.state is State.READY
            status, _ = await post("/api/generate", BOB, model="a", prompt="hi", keep_alive="2h")
            assert status == 200 and handle.keep_alive == 600
            # An admin key keeps Ollama's whole meaning: for ever, and unload.
            status, _ = await post("/api/chat", ADMIN, model="a", messages=HI, keep_alive=-1)
            assert status == 200 and handle.keep_alive == -1
            status, got = await post("/api/chat", ADMIN, model="a", messages=[], keep_alive=0)
            assert (status, got["done_reason"]) == (200, "unload")
            await wait_for(lambda: handle.state is State.STOPPED, 10, "the admin's keep_alive 0")


async def test_max_keep_alive_lets_an_api_key_keep_a_model_up_to_it(tmp_path: Path) -> None:
    sup = _keyed(tmp_path, {"a": {}, "e": {"embeddings": True}}, max_keep_alive=900)
    client = create_app(sup, sup.config).test_client()
    post = partial(_ollama, client)
    with trio.fail_after(30):
        async with running(sup):
            for asked, kept in ((-1, 900), ("2h", 900), ("12m", 720), ("10s", 600), (0, 600)):
                status, _ = await post("/api/chat", ALICE, model="a", messages=HI, keep_alive=asked)
                assert status == 200 and sup.handles["a"].keep_alive == kept, asked
            status, _ = await post("/api/embed", BOB, model="e", input=["x"], keep_alive=-1)
            assert status == 200 and sup.handles["e"].keep_alive == 900


async def _ollama(client: Any, path: str, key: str, **body: Any) -> tuple[int, Any]:
    r = await client.post(path, json={"stream": False, **body}, headers=_bearer(key), scope_base=REMOTE)
    return r.status_code, await r.get_json()


async def test_slots_show_another_keys_running_request_as_busy_and_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")  # 40 tokens: two seconds in flight
    sup = _keyed(tmp_path, {"a": {"slots": 2}})
    client = create_app(sup, sup.config).test_client()

    async def slots(key: str) -> tuple[list[dict[str, Any]], bytes]:
        r = await client.get("/slots?model=a", headers=_bearer(key), scope_base=REMOTE)
        assert r.status_code == 200
        return await r.get_json(), await r.get_data()

    async def alice_asks() -> None:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "a", "messages": HI, "max_tokens": 40, "stop": ["SECRET-STOP"], "seed": 31337},
            headers=_bearer(ALICE), scope_base=REMOTE,
        )
        assert r.status_code == 200

    with trio.fail_after(30):
        async with running(sup), trio.open_nursery() as nursery:
            nursery.start_soon(alice_asks)
            busy: list[dict[str, Any]] = []
            while not busy:
                await trio.sleep(0.05)
                busy = [s for s in (await slots(ADMIN))[0] if s["is_processing"]]
            # Alice sees her request, and an admin key sees it too...
            for key in (ALICE, ADMIN):
                [mine] = [s for s in (await slots(key))[0] if s["is_processing"]]
                assert mine["params"]["stop"] == ["SECRET-STOP"] and mine["params"]["seed"] == 31337
                assert "next_token" in mine and mine["id_task"] >= 0
            # ...Bob sees a busy slot and nothing of what runs in it.
            seen, raw = await slots(BOB)
            [theirs] = [s for s in seen if s["is_processing"]]
            assert theirs == {"id": theirs["id"], "n_ctx": 4096, "speculative": False, "is_processing": True}
            assert b"SECRET-STOP" not in raw and b"31337" not in raw


async def test_with_api_keys_but_no_admin_key_admin_and_metrics_answer_no_one(tmp_path: Path) -> None:
    """On a shared host every local user is a loopback client: once API keys exist,
    keyless loopback access would let any of them unload or reload. public_metrics still
    opens /metrics alone, and a server with no key at all stays one user's."""
    sup = _supervisor(tmp_path, {"a": {}}, api_keys=[ALICE])
    client = create_app(sup, sup.config).test_client()
    for peer in ({"client": ("127.0.0.1", 40000)}, {"client": ("::1", 1)}, REMOTE):
        for headers in ({}, _bearer(ALICE)):
            for path in ("/admin/models", "/metrics", "/admin/reload"):
                r = await (client.post if path == "/admin/reload" else client.get)(path, headers=headers, scope_base=peer)
                assert r.status_code == 403, (path, peer, headers)
                assert "admin_keys" in (await r.get_json())["error"]["message"]
    sup = _supervisor(tmp_path, {"a": {}}, api_keys=[ALICE], public_metrics=True)
    client = create_app(sup, sup.config).test_client()
    assert (await client.get("/metrics", scope_base=REMOTE)).status_code == 200
    assert (await client.get("/admin/models", scope_base={"client": ("127.0.0.1", 1)})).status_code == 403
    sup = _supervisor(tmp_path, {"a": {}})
    client = create_app(sup, sup.config).test_client()
    assert (await client.get("/admin/models", scope_base={"client": ("127.0.0.1", 1)})).status_code == 200


async def test_corrals_commands_say_what_to_set_when_the_server_wants_an_admin_key(tmp_path: Path) -> None:
    path = write_config(tmp_path / "corral.toml", {"chat": {}}, {"api_keys": [ALICE]})
    sup = Supervisor(parse(path.read_text(), tmp_path), worker_command=WORKER_COMMAND)
    with trio.fail_after(60):
        async with serving_http(sup) as url:
            done = await corral("status", "--url", url, cwd=tmp_path)
            assert done.returncode == 4
            assert "admin_keys" in err(done) and "$CORRAL_ADMIN_KEY" in err(done)
            done = await corral(
                "config", "set", "--config", str(path), "models.chat.slots", "2", "--reload", "--url", url, cwd=tmp_path
            )
            assert done.returncode == 3
            assert "$CORRAL_ADMIN_KEY" in err(done) and "--signal" in err(done) and "pid_file" in err(done)
