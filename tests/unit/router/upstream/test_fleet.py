"""Asking one server of the fleet for its models (router/upstream/fleet.py): whatever it
answers, or fails to, is its own row, bounded in time and size."""

from __future__ import annotations

import json

import httpx
import pytest

from router.upstream import fleet

MODELS = {"models": [{"name": "m", "state": "ready"}], "upstreams": []}


def _client(status: int, body: bytes) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/admin/models" and request.headers["authorization"] == "Bearer k"
        return httpx.Response(status, stream=httpx.ByteStream(body))  # read as a real one is, raw

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


@pytest.mark.parametrize("status, body, expect", [
    (200, json.dumps(MODELS).encode(), None),
    (200, b"<html>a proxy</html>", "not a Corral server's /admin/models"),
    (200, b'{"data": []}', "not a Corral server's /admin/models"),
    (401, b'{"error": {}}', "answered 401 (check [server] fleet_key_env"),
    (500, b"", "answered 500"),
    (200, b"[" + b"1," * (fleet.MAX_BYTES // 2) + b"1]", "larger than"),
])
@pytest.mark.trio
async def test_each_answer_is_the_servers_models_or_why_not(status: int, body: bytes, expect: str | None) -> None:
    async with _client(status, body) as client:
        got = await fleet.ask(client, "http://h:8080/", "k")
    assert got["url"] == "http://h:8080"
    if expect is None:
        assert got == {**MODELS, "url": "http://h:8080"}
    else:
        assert expect in got["error"] and "models" not in got


@pytest.mark.trio
async def test_the_fleet_is_answered_in_its_order() -> None:
    async with _client(200, json.dumps(MODELS).encode()) as client:
        got = await fleet.gather(client, ["http://b:1", "http://a:1"], "k")
    assert [g["url"] for g in got] == ["http://b:1", "http://a:1"]
