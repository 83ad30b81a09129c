"""The relay to upstream models (router/upstream/), through the real app, against a fake
upstream served by hypercorn in the test: what reaches the upstream (the configured key,
never the client's; the body as it came, the model renamed), keys' scopes, timeouts,
failover on a 5xx, and an answer cut off mid-way (issue 25, item 1)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve

from supervisor.config import parse
from supervisor.supervisor import Supervisor
from tests.process.support import WORKER_COMMAND, serving_http
from tests.secrets import secret

CLIENT_KEY = secret("client")
SCOPED = secret("scoped")
UPSTREAM_KEY = secret("upstream")
ADMIN = secret("admin")


async def request_body(scope: Any, receive: Any, send: Any) -> bytes | None:
    """A fake ASGI server's start: its lifespan answered (None), or an HTTP request's body."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return None
    if scope["type"] != "http":
        return None
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


class FakeUpstream:
    """An OpenAI-compatible server that records what it is sent; what it answers depends on
    the `model` the body names."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = await request_body(scope, receive, send)
        if body is None:
            return
        headers = {k.decode(): v.decode("latin-1") for k, v in scope["headers"]}
        self.seen.append((scope["path"], headers, body))
        model = json.loads(body).get("model") if body else None
        start = partial(send, {"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"set-cookie", b"upstream-session=1; Path=/"),
        ]})
        if model == "hangs":
            await trio.sleep_forever()
        if model == "fails":
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b"down"})
            return
        if model == "breaks":  # headers and one event, then the connection drops
            await start()
            await send({"type": "http.response.body", "body": b"data: {\"n\": 1}\n\n", "more_body": True})
            raise RuntimeError("the upstream dies mid-answer")
        await start()
        for i in range(3):
            await send({"type": "http.response.body", "body": f"data: {{\"n\": {i}}}\n\n".encode(), "more_body": True})
            await trio.sleep(0.05)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


@asynccontextmanager
async def upstream_and_front(
    tmp_path: Path, tables: str, server: str = "", fake: Any = None
) -> AsyncIterator[tuple[Any, str]]:
    """`fake` (an ASGI app; a FakeUpstream by default) served on a free port as {UP}'s
    server, and the front with `tables`; yields both."""
    fake = FakeUpstream() if fake is None else fake
    hc = HyperConfig()
    hc.bind = ["127.0.0.1:0"]
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, fake, hc))
        text = f"[server]\n{server}\n" + tables.replace("{UP}", binds[0] + "/v1")
        cfg = parse(text, tmp_path)
        async with serving_http(Supervisor(cfg, worker_command=WORKER_COMMAND)) as front:
            yield fake, front
        nursery.cancel_scope.cancel()


TABLES = """
[models.chat]
upstream = "{UP}"
upstream_model = "renamed"
api_key_env = "CORRAL_TEST_UPSTREAM_KEY"
aliases = ["c"]

[models.hangs]
upstream = "{UP}"
timeout = 0.5

[models.breaks]
upstream = "{UP}"

[models.fails]
upstream = ["{UP}", "http://127.0.0.1:9/v1"]

[models.llama]
upstream = "{UP}"
upstream_model = "llama3.2:3b"
upstream_dialects = ["openai", "ollama"]

[models.claude]
upstream = "{UP}"
upstream_dialects = ["anthropic"]
"""


@pytest.mark.trio
async def test_the_upstream_gets_the_body_as_it_came_and_the_configured_key_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    async with upstream_and_front(tmp_path, TABLES, f'api_keys = ["{CLIENT_KEY}"]') as (fake, front):
        sent = b'{"model": "c",  "messages": [{"role": "user", "content": "hi"}], "unknown_field": [1, 2]}'
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.post(front + "/v1/chat/completions?x=1", content=sent, headers={
                "authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json",
                "cookie": "session=secret", "x-session-id": "s-1",
            })
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") and r.text.count("data:") == 4
        path, headers, body = fake.seen[-1]
        assert path == "/v1/chat/completions"
        assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}" and "cookie" not in headers
        assert CLIENT_KEY not in json.dumps(headers) and headers["x-session-id"] == "s-1"
        # Every field passes, Corral's unknown ones too; only the model is the upstream's name.
        assert json.loads(body) == {**json.loads(sent), "model": "renamed"}


@pytest.mark.trio
async def test_a_key_limited_to_other_models_sees_no_upstream_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    keys = (
        f'api_keys = [{{key = "{SCOPED}", name = "scoped", models = ["breaks"]}}, "{CLIENT_KEY}"]\n'
        f'admin_keys = ["{ADMIN}"]'
    )
    async with upstream_and_front(tmp_path, TABLES, keys) as (fake, front):
        async with httpx.AsyncClient(timeout=10, headers={"authorization": f"Bearer {SCOPED}"}) as c:
            r = await c.post(front + "/v1/chat/completions", json={"model": "chat", "messages": []})
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
            listed = {m["id"] for m in (await c.get(front + "/v1/models")).json()["data"]}
            assert listed == {"breaks"}
            assert (await c.get(front + "/v1/models/chat")).status_code == 404
        assert fake.seen == []
        async with httpx.AsyncClient(timeout=10) as c:  # no key at all: refused before any relay
            assert (await c.post(front + "/v1/chat/completions", json={"model": "chat"})).status_code == 401
        assert fake.seen == []
        # Where the replicas are is the operator's to know: an admin key sees the URLs, an
        # API key the count in rotation, as a local model's file path stays out of its view.
        for key, operator in ((CLIENT_KEY, False), (ADMIN, True)):
            async with httpx.AsyncClient(timeout=10, headers={"authorization": f"Bearer {key}"}) as c:
                entry = (await c.get(front + "/v1/models/breaks")).json()
            (replica,) = entry["upstream"]["replicas"]
            assert ("url" in replica, "last_error" in replica, "model" in entry["upstream"]) == (operator,) * 3
            assert replica["replica"] == 0 and replica["healthy"] is True


@pytest.mark.trio
async def test_an_upstream_that_stays_silent_past_its_timeout_is_a_503(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    async with upstream_and_front(tmp_path, TABLES) as (_, front):
        async with httpx.AsyncClient(timeout=10) as c:
            t0 = trio.current_time()
            r = await c.post(front + "/v1/chat/completions", json={"model": "hangs", "messages": []})
            assert trio.current_time() - t0 < 3
        assert r.status_code == 503 and "answered (1 tried)" in r.json()["error"]["message"]


def _asgi_tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The ASGI server's tracebacks of the front: the fake upstream's own (its RuntimeError,
    how it breaks off) left out."""
    return [
        repr(r.exc_info[1]) for r in caplog.records
        if r.getMessage() == "Error in ASGI Framework" and r.exc_info
        and "the upstream dies mid-answer" not in repr(r.exc_info[1])
    ]


@pytest.mark.trio
async def test_a_5xx_fails_over_and_a_cut_answer_is_never_a_whole_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cut answer ends the client's connection without its last chunk. Found by the
    outside probe of issue 40 (N3): each break also printed the ASGI server's traceback,
    and the access log blamed the client (`client-gone`)."""
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("CORRAL_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    async with upstream_and_front(tmp_path, TABLES) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            # `fails` has a second replica that refuses connections: a 503 is tried on the
            # other replica, and the client gets a 503 once neither can answer (the
            # upstream's, or Corral's saying both were tried: by the replicas' order).
            r = await c.post(front + "/v1/chat/completions", json={"model": "fails", "messages": []})
            message = r.json()["error"]["message"]  # the fake's 503 is plain text: in OpenAI's shape
            assert r.status_code == 503 and ("answered (2 tried)" in message or "failed (503)" in message), message
            assert [json.loads(b)["model"] for _, _, b in fake.seen] == ["fails"]
            with pytest.raises(httpx.RemoteProtocolError):
                async with c.stream("POST", front + "/v1/chat/completions", json={"model": "breaks"}) as s:
                    assert s.status_code == 200
                    async for _ in s.aiter_raw():
                        pass
            await trio.sleep(0.2)  # the access log line is written once the request is done
    assert _asgi_tracebacks(caplog) == []
    broke = [r.getMessage() for r in caplog.records if r.name == "corral.upstream" and "broke off" in r.getMessage()]
    assert len(broke) == 1, broke
    lines = [r.getMessage() for r in caplog.records if r.name == "corral.access" and "model=breaks" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith(" upstream-broke"), lines


@pytest.mark.trio
async def test_what_a_hostile_client_sends_never_reaches_past_the_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by probing the front (2026-11-27): a dot segment took `/v1/%2e%2e/admin/reload`
    to the upstream's /admin/reload with the upstream's key; invalid UTF-8 in the body and a
    Latin-1 header value were 500s; one upstream's cookie rode on later requests."""
    monkeypatch.setenv("CORRAL_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    async with upstream_and_front(tmp_path, TABLES) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            for path in ("/v1/%2e%2e/admin/reload", "/v1/%2E%2E/%2e%2e/admin/models/x/unload", "/v1/%2e/chat/completions"):
                r = await c.post(front + path, json={"model": "chat"})
                assert r.status_code == 404, (path, r.text)
            assert fake.seen == []
            bad = b'{"model": "chat", "messages": [{"role": "user", "content": "\xff"}]}'
            r = await c.post(front + "/v1/chat/completions", content=bad, headers={"content-type": "application/json"})
            assert r.status_code == 400 and fake.seen == []
            for _ in range(2):  # the first answer sets a cookie; the second request carries none
                r = await c.post(front + "/v1/chat/completions", json={"model": "chat"}, headers={"user-agent": b"caf\xe9"})
                assert r.status_code == 200
            assert [h.get("cookie") for _, h, _ in fake.seen] == [None, None]
            assert fake.seen[0][1]["user-agent"] == "caf\xe9"  # as it came, Latin-1
            assert fake.seen[0][1]["via"].startswith("1.1 corral-")


@pytest.mark.trio
async def test_ollama_lists_the_upstream_models_that_take_its_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/api/tags lists a model served elsewhere if its upstream speaks Ollama's API, or
    OpenAI's or Anthropic's, which Ollama's chats reach translated (else a client would
    pick a model it cannot reach), as Ollama lists its cloud models: no size or digest, the
    name there as remote_model. A client names it with its tag, as listed."""
    monkeypatch.setenv("CORRAL_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    async with upstream_and_front(tmp_path, TABLES) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            listed = (await c.get(front + "/api/tags")).json()["models"]
            r = await c.post(front + "/api/chat", json={"model": "llama:latest", "messages": []})
    assert r.status_code == 200 and json.loads(fake.seen[-1][2])["model"] == "llama3.2:3b"
    assert [(m["name"], m["remote_model"], m["size"]) for m in listed] == [
        # An alias is listed after its model (issue 41, item 3: `llm -m c` must find it).
        ("chat:latest", "renamed", 0), ("c:latest", "renamed", 0), ("hangs:latest", "hangs", 0), ("breaks:latest", "breaks", 0),
        ("fails:latest", "fails", 0), ("llama:latest", "llama3.2:3b", 0), ("claude:latest", "claude", 0),
    ]
    assert listed[0]["modified_at"].endswith("Z") and listed[0]["details"]["format"] == ""
