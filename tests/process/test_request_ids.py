"""x-request-id on every answer, and one access log line per request, written when the
answer is done (the real server on a socket, fake workers)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from supervisor.config import parse
from supervisor.supervisor import Supervisor
from tests.harness import write_gguf, config_text
from tests.process.support import WORKER_COMMAND, serving_http
from tests.secrets import secret

KEY = secret("access-log")
CHAT = {"model": "alias-a", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 5}


def _supervisor(tmp_path: Path) -> Supervisor:
    write_gguf(tmp_path / "dummy.gguf")
    text = config_text({"a": {"aliases": ["alias-a"]}, "e": {"embeddings": True}})
    text = text.replace("[server]\n", f'[server]\napi_keys = [{{ key = "{KEY}", name = "alice" }}]\n')
    cfg = parse(text, tmp_path)
    return Supervisor(cfg, worker_command=WORKER_COMMAND)


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records if r.name == "corral.access"]  # type: ignore[attr-defined]


async def test_every_answer_carries_a_request_id_and_logs_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral.access")
    sup = _supervisor(tmp_path)
    auth = {"authorization": f"Bearer {KEY}"}
    with trio.fail_after(30):
        async with serving_http(sup) as base:
            async with httpx.AsyncClient(base_url=base, timeout=10) as c:
                chat = await c.post("/v1/chat/completions", json=CHAT, headers={**auth, "x-request-id": "trace-1"})
                assert chat.status_code == 200 and chat.headers["x-request-id"] == "trace-1"
                streamed = await c.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth)
                assert streamed.status_code == 200 and len(streamed.headers["x-request-id"]) == 32
                embedded = await c.post("/v1/embeddings", json={"model": "e", "input": ["a b", "c"]}, headers=auth)
                assert embedded.status_code == 200
                refused = await c.get("/v1/models", headers={"x-request-id": 'bad id" status=200'})
                assert refused.status_code == 401 and len(refused.headers["x-request-id"]) == 32
                missing = await c.get("/nowhere", headers=auth)
                assert missing.status_code == 404 and missing.headers["x-request-id"]
                health = await c.get("/health")
                assert health.headers["x-request-id"]
                three = await c.post("/v1/chat/completions", json={**CHAT, "n": 3}, headers=auth)
                assert three.status_code == 200
    lines = {f["request_id"]: f for f in _lines(caplog)}
    assert len(_lines(caplog)) == 7 == len(lines)  # one line a request, each id its own
    # n = 3 choices share one prompt: counted once, as usage counts it.
    n3 = lines[three.headers["x-request-id"]]
    assert n3["prompt_tokens"] == three.json()["usage"]["prompt_tokens"]
    assert n3["generated_tokens"] == three.json()["usage"]["completion_tokens"] == 15
    first = lines["trace-1"]
    assert first["key"] == "alice" and first["model"] == "a" and first["status"] == 200
    assert first["client"] == "127.0.0.1" and first["endpoint"] == "/v1/chat/completions" and first["method"] == "POST"
    assert first["prompt_tokens"] == chat.json()["usage"]["prompt_tokens"]
    assert first["generated_tokens"] == chat.json()["usage"]["completion_tokens"] == 5
    assert 0 < first["ttft"] <= first["duration"] and not first["client_gone"]
    stream = lines[streamed.headers["x-request-id"]]
    assert stream["generated_tokens"] == 5 and stream["status"] == 200 and not stream["client_gone"]
    assert lines[embedded.headers["x-request-id"]]["prompt_tokens"] == embedded.json()["usage"]["prompt_tokens"]
    no_key = lines[refused.headers["x-request-id"]]
    assert no_key["status"] == 401 and no_key["key"] is None and no_key["prompt_tokens"] is None
    assert lines[missing.headers["x-request-id"]]["status"] == 404
    for f in lines.values():
        assert KEY not in repr(f)


async def test_a_stream_the_client_leaves_is_logged_as_such(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "20")
    caplog.set_level(logging.INFO, logger="corral.access")
    sup = _supervisor(tmp_path)
    with trio.fail_after(30):
        async with serving_http(sup) as base:
            async with httpx.AsyncClient(base_url=base, timeout=10) as c:
                body = {**CHAT, "stream": True, "max_tokens": 200}
                async with c.stream("POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}", "x-request-id": "leaver"}) as r:
                    async for _ in r.aiter_lines():
                        break  # one event, then gone
            while not any(f["request_id"] == "leaver" for f in _lines(caplog)):
                await trio.sleep(0.02)
    left = next(f for f in _lines(caplog) if f["request_id"] == "leaver")
    assert left["client_gone"] and left["status"] == 200 and left["duration"] < 5
