"""llama-server's own routes over the real app and supervisor, with simulated workers
(tests/fake_answers.py says what they answer): shapes, streams and error shapes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import msgspec
import trio

from router.app import create_app
from router.api.autoload import may_load
from supervisor.lifecycle import State
from tests.harness import running
from tests.sim.support import sim_supervisor, until_state


def events_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


async def test_completion_answers_and_streams_in_llama_servers_shape(tmp_path: Path, autojump_clock: object) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {"n_ctx": 512}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.post("/completion", json={"model": "a", "prompt": "hi there", "n_predict": 3})
        assert r.status_code == 200
        out = await r.get_json()
        assert out["content"] == "tok0 tok1 tok2" and out["stop"] is True
        assert out["stop_type"] == "limit" and out["stopping_word"] == "" and out["truncated"] is False
        assert out["tokens_predicted"] == 3 and out["tokens_evaluated"] == 3  # BOS + two words
        assert out["model"] == "a" and out["prompt"] == "hi there" and out["id_slot"] == 0
        assert out["generation_settings"]["n_predict"] == 3 and out["generation_settings"]["n_ctx"] == 512
        assert out["timings"]["predicted_n"] == 3 and out["timings"]["predicted_per_second"] > 0

        r = await client.post("/completion", json={
            "model": "a", "prompt": "hi", "n_predict": 2, "response_fields": ["content", "generation_settings/n_predict"],
        })
        assert await r.get_json() == {"content": "tok0 tok1", "n_predict": 2}

        r = await client.post("/completion", json={"model": "a", "prompt": "hi", "n_predict": 3, "stream": True})
        text = await r.get_data(as_text=True)
        assert "[DONE]" not in text
        *partial, last = events_of(text)
        assert [e["content"] for e in partial] == ["tok0", " tok1"]
        assert all(e["stop"] is False for e in partial)
        assert last["stop"] is True and last["content"] == " tok2" and "timings" in last


async def test_token_prompts_and_their_text(tmp_path: Path, autojump_clock: object) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.post("/completion", json={"model": "a", "prompt": [1, "x y", 7], "n_predict": 1})
        out = await r.get_json()
        assert out["tokens_evaluated"] == 4 and out["prompt"] == "<1>x y<7>"
        r = await client.post("/completion", json={"model": "a", "prompt": [1, 32000]})
        assert r.status_code == 400
        err = (await r.get_json())["error"]
        assert err == {
            "code": 400, "type": "invalid_request_error", "param": "prompt",
            "message": "Invalid token id 32000 at prompt[1]: this model's vocabulary has ids 0 to 31999.",
        }


async def test_tokenize_detokenize_apply_template_props_slots(tmp_path: Path, autojump_clock: object) -> None:
    sup, _ = sim_supervisor(tmp_path, {"a": {"slots": 3, "aliases": ["al"]}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        r = await client.post("/tokenize", json={"model": "a", "content": "a b", "with_pieces": True})
        tokens = (await r.get_json())["tokens"]
        assert [t["piece"] for t in tokens] == ["a", "b"] and all(isinstance(t["id"], int) for t in tokens)
        r = await client.post("/detokenize", json={"model": "a", "tokens": [3, 4]})
        assert await r.get_json() == {"content": "<3><4>"}
        r = await client.post("/apply-template", json={"model": "a", "messages": [{"role": "user", "content": "hi"}]})
        assert await r.get_json() == {"prompt": "<user>hi\n<assistant>"}
        r = await client.get("/props?model=al")
        props = await r.get_json()
        assert props["total_slots"] == 3 and props["model_alias"] == "al" and props["model_path"] == "dummy.gguf"
        assert props["default_generation_settings"]["params"]["top_k"] == 40
        r = await client.get("/slots?model=a")
        slots = await r.get_json()
        assert [s["id"] for s in slots] == [0, 1, 2] and not any(s["is_processing"] for s in slots)


async def test_native_errors_are_in_llama_servers_shape(tmp_path: Path, autojump_clock: object) -> None:
    # Two models, so that a request naming none has no model to go to.
    sup, _ = sim_supervisor(tmp_path, {"a": {}, "b": {}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        cases = [
            (await client.post("/completion", json={"prompt": "hi"}), 400, "invalid_request_error"),
            (await client.post("/completion", data=b"{nope", headers={"content-type": "application/json"}),
             400, "invalid_request_error"),
            (await client.post("/completion", json={"model": "zz", "prompt": "hi"}), 404, "not_found_error"),
            (await client.get("/completion"), 405, "invalid_request_error"),
            (await client.get("/slots"), 400, "invalid_request_error"),
            (await client.post("/completion", json={"model": "a", "prompt": "x", "grammar": "root ::= \"a\"",
                                                    "json_schema": {}}),
             400, "invalid_request_error"),
            (await client.post("/completion", json={"model": "a", "prompt": "x", "bogus": 1}), 400,
             "invalid_request_error"),
        ]
        for r, status, type_ in cases:
            assert r.status_code == status
            err = (await r.get_json())["error"]
            assert err["code"] == status and err["type"] == type_ and err["message"]
        # The OpenAI routes keep OpenAI's envelope.
        r = await client.post("/v1/completions", json={"prompt": "hi"})
        err = (await r.get_json())["error"]
        assert err["code"] is None and err["param"] == "model" and err["type"] == "invalid_request_error"


async def test_router_modes_autoload_sleep_and_props(tmp_path: Path, autojump_clock: object) -> None:
    """Issue 22, item 7: llama-server's router mode (server-models.cpp; test_router.py
    test_router_no_models_autoload, test_router_props, test_router_unload_model; test_sleep.py
    test_server_sleep). With models_autoload off, a request for a model that is not loaded
    is a 400 "model is not loaded" until POST /models/load (or `?autoload=true`); a model
    its idle_timeout stopped is "sleeping": GET /props answers from its last load with
    is_sleeping and loads nothing, and a request wakes it even with autoload off; an
    unload makes it "unloaded". Without `model` and without a default, /props is the
    router's own."""
    sup, launcher = sim_supervisor(tmp_path, {"a": {"idle_timeout": 30}, "b": {}}, max_loaded_models=2)
    sup.config = dataclasses.replace(
        sup.config, server=msgspec.structs.replace(sup.config.server, models_autoload=False)
    )
    client = create_app(sup, sup.config).test_client()
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    async def status(name: str) -> str:
        data = (await (await client.get("/models")).get_json())["data"]
        return str(next(m for m in data if m["id"] == name)["status"]["value"])

    async with running(sup):
        props = await (await client.get("/props")).get_json()
        assert props["role"] == "router" and props["max_instances"] == 2 and props["models_autoload"] is False
        r = await client.post("/v1/chat/completions", json={**chat, "model": "a"})
        assert r.status_code == 400
        error = (await r.get_json())["error"]
        assert "model is not loaded" in error["message"] and error["param"] == "model"
        r = await client.post("/completion", json={"model": "a", "prompt": "x", "n_predict": 1})
        assert r.status_code == 400 and "model is not loaded" in (await r.get_json())["error"]["message"]
        assert sup.resolve("a").state is State.STOPPED and await status("a") == "unloaded"

        r = await client.post("/models/load", json={"model": "a"})
        assert r.status_code == 200 and await status("a") == "loaded"
        r = await client.post("/v1/chat/completions", json={**chat, "model": "a"})
        assert r.status_code == 200

        # ?autoload=true loads for that one request (server-models.cpp router_validate_model)
        r = await client.post("/v1/chat/completions?autoload=true", json={**chat, "model": "b"})
        assert r.status_code == 200 and sup.resolve("b").state is State.READY

        await trio.sleep(31)  # a's idle_timeout: asleep
        await until_state(sup.resolve("a"), State.STOPPED)
        assert await status("a") == "sleeping"
        starts = sup.resolve("a").starts
        props = await (await client.get("/props?model=a")).get_json()
        assert props["is_sleeping"] is True and props["model_alias"] == "a"
        assert sup.resolve("a").starts == starts and sup.resolve("a").state is State.STOPPED  # loaded nothing
        r = await client.post("/v1/chat/completions", json={**chat, "model": "a"})
        assert r.status_code == 200 and sup.resolve("a").starts == starts + 1  # woken
        assert (await (await client.get("/props?model=a")).get_json())["is_sleeping"] is False

        r = await client.post("/models/unload", json={"model": "a"})
        assert r.status_code == 200
        await until_state(sup.resolve("a"), State.STOPPED)
        assert await status("a") == "unloaded"
        r = await client.post("/v1/chat/completions", json={**chat, "model": "a"})
        assert r.status_code == 400  # unloaded on purpose: not asleep


def test_autoload_reads_the_request_over_the_config() -> None:
    assert may_load(True, None) and not may_load(False, None)
    assert may_load(False, "true") and may_load(False, "1") and may_load(False, "TRUE")
    assert not may_load(True, "false") and not may_load(True, "0") and not may_load(True, "yes")


async def test_props_without_a_model_is_the_routers_in_router_mode_only(tmp_path: Path, autojump_clock: object) -> None:
    """llama-server answers GET /props itself in router mode (--models-dir, its
    test_router.py test_router_props), and with its one model's otherwise."""
    sup, _ = sim_supervisor(tmp_path, {"a": {}})
    client = create_app(sup, sup.config).test_client()
    async with running(sup):
        assert "role" not in await (await client.get("/props")).get_json()  # one model: its own
        sup.config = dataclasses.replace(
            sup.config, server=msgspec.structs.replace(sup.config.server, models_dir=str(tmp_path))
        )
        props = await (await client.get("/props")).get_json()
        assert props["role"] == "router" and props["models_autoload"] is True
        sup.config = dataclasses.replace(
            sup.config, server=msgspec.structs.replace(sup.config.server, default_model="a")
        )
        assert "role" not in await (await client.get("/props")).get_json()  # a default: its props
