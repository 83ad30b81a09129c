"""llama-server's behaviours that llama.cpp's own server tests check (tools/server/tests/unit
of the llama.cpp that llama-cpp-python 0.3.36 vendors), re-expressed against Corral with
the process fake worker (issue 22, item 8). Each test names the upstream test it comes
from; tests/peer/ runs the upstream suite itself."""

from __future__ import annotations

import socket
from pathlib import Path

import trio

from router.app import create_app
from supervisor.config import parse
from supervisor.supervisor import Supervisor
from tests.harness import config_text, running, write_gguf
from tests.process.support import WORKER_COMMAND, serving_http


def _sup(tmp_path: Path, models: dict[str, dict[str, object]], **server: object) -> Supervisor:
    write_gguf(tmp_path / "dummy.gguf")
    return Supervisor(parse(config_text(models, server), tmp_path), worker_command=WORKER_COMMAND)


async def test_slots_endpoint_off_answers_501(tmp_path: Path) -> None:
    """test_basic.py test_server_slots: with --no-slots, GET /slots is 501 with an error."""
    sup = _sup(tmp_path, {"a": {"slots": 2}}, slots_endpoint=False)
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(20):
        async with running(sup):
            r = await client.get("/slots")
            body = await r.get_json()
            assert r.status_code == 501 and body["error"]["type"] == "not_supported_error"
            assert "slots_endpoint" in body["error"]["message"]
    sup = _sup(tmp_path, {"a": {"slots": 2}})
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(20):
        async with running(sup):
            slots = await (await client.get("/slots")).get_json()
            # An idle slot has no task, so no params (test_server_slots: "params" not in it).
            assert len(slots) == 2 and "params" not in slots[0] and slots[0]["is_processing"] is False


async def test_models_list_every_name_the_tags_and_the_status(tmp_path: Path) -> None:
    """test_basic.py test_server_model_aliases_and_tags (--alias tinyllama-2,fim,code --tags
    chat,fim,small): `aliases` holds every name, the id among them; `tags` the tags. And
    test_router.py's `status.value`: unloaded, then loaded once a request loaded it."""
    sup = _sup(tmp_path, {"code": {"aliases": ["fim", "tinyllama-2"], "tags": ["chat", "fim", "small"]}})
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(20):
        async with running(sup):
            for path in ("/models", "/v1/models"):
                (model,) = (await (await client.get(path)).get_json())["data"]
                assert model["id"] == "code"
                assert set(model["aliases"]) == {"tinyllama-2", "fim", "code"}
                assert set(model["tags"]) == {"chat", "fim", "small"}
                assert model["status"]["value"] == "unloaded"
            r = await client.post("/completion", json={"model": "fim", "prompt": "x", "n_predict": 2})
            assert r.status_code == 200
            (model,) = (await (await client.get("/models")).get_json())["data"]
            assert model["status"]["value"] == "loaded"


async def test_props_name_the_file_and_the_models_defaults(tmp_path: Path) -> None:
    """test_basic.py test_server_props: `model_path` is the GGUF (".gguf" in it), and the
    default generation settings carry the server's seed (--seed 42)."""
    sup = _sup(tmp_path, {"a": {"seed": 42, "temperature": 0.5, "n_predict": 64}})
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(20):
        async with running(sup):
            props = await (await client.get("/props")).get_json()
            assert props["model_path"] == "dummy.gguf"
            params = props["default_generation_settings"]["params"]
            assert (params["seed"], params["temperature"], params["n_predict"]) == (42, 0.5, 64)


async def test_unknown_model_default_serves_any_name_with_the_default(tmp_path: Path) -> None:
    """test_security.py test_openai_library_correct_api_key and test_embedding.py's openai
    library tests send model="gpt-3.5-turbo" / "text-embedding-3-small" to a server of one
    model, which llama-server serves anyway. Corral answers 404 unless the config says
    `unknown_model = "default"` (a deliberate difference: a typo in a model's name should
    not silently reach another model)."""
    body = {"model": "gpt-3.5-turbo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    sup = _sup(tmp_path, {"a": {}, "b": {}}, default_model="b")
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(20):
        async with running(sup):
            r = await client.post("/v1/chat/completions", json=body)
            assert r.status_code == 404 and (await r.get_json())["error"]["param"] == "model"
    sup = _sup(tmp_path, {"a": {}, "b": {}}, default_model="b", unknown_model="default")
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(20):
        async with running(sup):
            r = await client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200
            assert sup.handles["b"].statistics().requests_per_minute == 1
            assert sup.handles["a"].statistics().requests_per_minute == 0
            # A name it serves still goes to its own model.
            r = await client.post("/v1/chat/completions", json={**body, "model": "a"})
            assert r.status_code == 200 and sup.handles["a"].statistics().requests_per_minute == 1


async def test_header_names_are_written_title_cased(tmp_path: Path) -> None:
    """test_security.py test_cors_options reads `res.headers["Access-Control-Allow-Origin"]`
    from a plain dict of the headers: the name must be written as llama-server writes it."""
    sup = _sup(tmp_path, {"a": {}}, cors_origins=["*"])
    with trio.fail_after(20):
        async with serving_http(sup) as base:
            host, port = base.removeprefix("http://").rsplit(":", 1)

            def preflight() -> bytes:
                with socket.create_connection((host, int(port)), timeout=10) as s:
                    s.sendall(
                        b"OPTIONS /completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://localhost:3000\r\n"
                        b"Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n"
                    )
                    data = b""
                    while chunk := s.recv(4096):
                        data += chunk
                    return data

            head = (await trio.to_thread.run_sync(preflight)).split(b"\r\n\r\n")[0]
            assert head.startswith(b"HTTP/1.1 200")
            assert b"\r\nAccess-Control-Allow-Origin: http://localhost:3000\r\n" in head
            assert b"\r\nAccess-Control-Allow-Credentials: true\r\n" in head


async def test_router_mode_load_and_unload(tmp_path: Path) -> None:
    """test_router.py test_router_unload_model and _load_model_and_wait: POST /models/load
    {"model"} answers {"success": true} and the model reads `loaded` in GET /models;
    unload answers the same and it reads `unloaded`. Loading a running model, or
    unloading a stopped one, is a 400 (llama-server's "already running" / "not running")."""
    sup = _sup(tmp_path, {"a": {}, "b": {}})
    client = create_app(sup, sup.config).test_client()

    async def status(name: str) -> str:
        data = (await (await client.get("/models")).get_json())["data"]
        return next(m["status"]["value"] for m in data if m["id"] == name)

    with trio.fail_after(30):
        async with running(sup):
            r = await client.post("/models/unload", json={"model": "a"})
            assert r.status_code == 400 and "not running" in (await r.get_json())["error"]["message"]
            r = await client.post("/models/load", json={"model": "a"})
            assert r.status_code == 200 and await r.get_json() == {"success": True}
            assert await status("a") == "loaded" and await status("b") == "unloaded"
            r = await client.post("/models/load", json={"model": "a"})
            assert r.status_code == 400 and (await r.get_json())["error"]["type"] == "invalid_request_error"
            r = await client.post("/models/unload", json={"model": "a"})
            assert r.status_code == 200 and await r.get_json() == {"success": True}
            for _ in range(200):
                if await status("a") == "unloaded":
                    break
                await trio.sleep(0.05)
            assert await status("a") == "unloaded"
            r = await client.post("/models/load", json={"model": "nope"})
            assert r.status_code == 404  # Corral's: an unknown name is not found (llama-server: 400)
            r = await client.post("/models/load", json={})
            assert r.status_code == 400 and (await r.get_json())["error"]["param"] == "model"


async def test_v1_errors_in_llama_servers_shape_when_the_config_asks(tmp_path: Path) -> None:
    """test_chat_completion.py test_context_size_exceeded: llama-server answers a context
    overflow on its OpenAI routes as exceed_context_size_error with n_prompt_tokens and
    n_ctx. Corral answers in OpenAI's shape (context_length_exceeded), unless
    `v1_error_shape = "llama-server"`; its own /admin routes keep theirs either way."""
    body = {"model": "a", "prompt": "w " * 70, "max_tokens": 2}
    sup = _sup(tmp_path, {"a": {"n_ctx": 64}})
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(20):
        async with running(sup):
            err = (await (await client.post("/v1/completions", json=body)).get_json())["error"]
            assert (err["type"], err["code"]) == ("invalid_request_error", "context_length_exceeded")
    sup = _sup(tmp_path, {"a": {"n_ctx": 64}}, v1_error_shape="llama-server")
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(20):
        async with running(sup):
            r = await client.post("/v1/completions", json=body)
            err = (await r.get_json())["error"]
            assert r.status_code == 400 and err["type"] == "exceed_context_size_error"
            assert err["code"] == 400 and err["n_ctx"] == 64 and err["n_prompt_tokens"] > 64
            r = await client.post("/admin/models/zz/load")
            assert (await r.get_json())["error"]["code"] == "model_not_found"  # Corral's own route


async def test_verbose_answers_carry_the_rendered_prompt(tmp_path: Path) -> None:
    """test_chat_completion.py test_verbose_debug (a request's `verbose`) and the
    __verbose of a server started with --verbose (test_chat_template_assistant_prefill),
    which is `verbose_responses = true` here; also test_chat_completions_multiple_choices:
    n = 2 with llama-server's `id_slot`, accepted."""
    body = {"model": "a", "max_tokens": 2, "messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "q"}]}
    sup = _sup(tmp_path, {"a": {}})
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(20):
        async with running(sup):
            out = await (await client.post("/v1/chat/completions", json={**body, "verbose": True})).get_json()
            assert "Book" in out["__verbose"]["prompt"] and out["choices"][0]["message"]["role"] == "assistant"
            out = await (await client.post("/v1/chat/completions", json=body)).get_json()
            assert "__verbose" not in out
            r = await client.post("/chat/completions", json={**body, "n": 2, "id_slot": 0})
            assert r.status_code == 200 and len((await r.get_json())["choices"]) == 2
    sup = _sup(tmp_path, {"a": {}}, verbose_responses=True)
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(20):
        async with running(sup):
            out = await (await client.post("/v1/chat/completions", json=body)).get_json()
            assert "Book" in out["__verbose"]["prompt"]
            out = await (await client.post("/v1/chat/completions", json={**body, "verbose": False})).get_json()
            assert "__verbose" not in out
