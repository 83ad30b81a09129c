"""An upstream that answers JSON nested 50,000 deep is a broken upstream, never a 500: every
decode of what an upstream sends goes through router/server/json_text.py, which turns
Python's RecursionError into the ValueError its readers already treat as "not JSON".

Before, each reader caught ValueError only, so the RecursionError escaped: a streamed event
(OpenAI's chunks, Anthropic's events), a tool call's arguments, an error body, an
embeddings answer and a count_tokens answer each made the route's answer `500 internal
error: RecursionError`, and a fleet server's /admin/models did the same to /admin/fleet.
Now each is what the same answer with any other text that is not JSON gives: a 502 in the
route's dialect (an `error` event once a stream has begun), and the fleet's row for that
server says its answer is not a Corral server's; the router goes on serving.
"""

from __future__ import annotations

import json
from collections.abc import Callable
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
from tests.process.test_upstream_relay import request_body, upstream_and_front

N = 50_000
DEEP = "[" * N + "]" * N
ANTHROPIC = {"anthropic-version": "2023-06-01"}
USER = [{"role": "user", "content": "Hi"}]


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return json.dumps({"id": "c1", "object": "chat.completion.chunk", "model": "up", "choices": choices, **extra})


USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
# Each model's stream, as `data:` payloads.
OPENAI_STREAMS: dict[str, list[str]] = {
    "talks": [_chunk({"role": "assistant", "content": "Hello"}), _chunk({}, "stop"), _chunk(None, usage=USAGE)],
    "deep_event": [DEEP],
    "deep_later": [_chunk({"role": "assistant", "content": "Half"}), DEEP],
    "deep_arguments": [  # the event is shallow; the call's arguments are text nested deep
        _chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                     "function": {"name": "f", "arguments": DEEP}}]}),
        _chunk({}, "tool_calls"),
        _chunk(None, usage=USAGE),
    ],
}


class DeepUpstream:
    """An OpenAI-compatible server and an Anthropic one in one (by path), and a fleet
    server: its answers are nested DEEP where the model's name says so."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = await request_body(scope, receive, send)
        if body is None:
            return
        path = scope["path"]
        model = json.loads(body).get("model", "") if body else ""
        if path.endswith("/admin/models") or path.endswith("/embeddings") or path.endswith("/count_tokens"):
            await _answer(send, 200, "application/json", DEEP.encode())
        elif model.endswith("deep_error"):
            await _answer(send, 500, "application/json", DEEP.encode())
        elif path.endswith("/messages"):  # Anthropic's stream: its first event nested deep
            await _answer(send, 200, "text/event-stream", f"event: message_start\ndata: {DEEP}\n\n".encode())
        else:
            events = "".join(f"data: {d}\n\n" for d in OPENAI_STREAMS[model]) + "data: [DONE]\n\n"
            await _answer(send, 200, "text/event-stream", events.encode())


async def _answer(send: Any, status: int, kind: str, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", kind.encode())]})
    await send({"type": "http.response.body", "body": body})


def _table(name: str, dialect: str = "openai") -> str:
    return f'[models.{name}]\nupstream = "{{UP}}"\nupstream_model = "{name}"\nupstream_dialects = ["{dialect}"]\n'


TABLES = "".join(
    _table(n) for n in ("talks", "deep_event", "deep_later", "deep_arguments", "deep_error")
) + "".join(_table(n, "anthropic") for n in ("a_deep_event", "a_deep_error", "a_count"))


def _anthropic(r: httpx.Response) -> str:
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error", body
    return str(body["error"]["message"])


def _openai(r: httpx.Response) -> str:
    return str(r.json()["error"]["message"])


def _ollama(r: httpx.Response) -> str:
    return str(r.json()["error"])


def _messages(model: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/messages", {"model": model, "max_tokens": 8, "messages": USER, **extra}


def _chat(model: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"model": model, "messages": USER, **extra}


# (what the upstream answers deep, the request, the error's message in the route's dialect,
# what that message says): the same as for an answer that is not JSON at all.
CASES = [
    # An OpenAI upstream, reached from Anthropic's and Ollama's routes.
    ("an event, whole answer asked", _messages("deep_event"), _anthropic, "not JSON"),
    ("an event, stream asked", _messages("deep_event", stream=True), _anthropic, "not JSON"),
    ("an event, for ollama", ("/api/chat", {"model": "deep_event", "messages": USER, "stream": False}), _ollama, "not JSON"),
    ("a call's arguments", _messages("deep_arguments"), _anthropic, "not a JSON object"),
    ("a call's arguments, for ollama",
     ("/api/chat", {"model": "deep_arguments", "messages": USER, "stream": False}), _ollama, "not a JSON object"),
    ("an error body", _messages("deep_error"), _anthropic, "answered 500"),
    ("an embeddings answer", ("/api/embed", {"model": "talks", "input": ["a"]}), _ollama, "embeddings of another shape"),
    # An Anthropic upstream, reached from OpenAI's and Responses' routes.
    ("an anthropic event, whole answer asked", _chat("a_deep_event"), _openai, "not JSON"),
    ("an anthropic event, stream asked", _chat("a_deep_event", stream=True), _openai, "not JSON"),
    ("an anthropic error body", _chat("a_deep_error"), _openai, "answered 500"),
    ("a count_tokens answer", ("/v1/responses/input_tokens", {"model": "a_count", "input": "Hi"}), _openai, "token count"),
]


@pytest.mark.trio
@pytest.mark.parametrize(("request_", "message", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_an_upstream_answer_nested_50000_deep_is_a_502_in_the_routes_dialect(
    tmp_path: Path, request_: tuple[str, dict[str, Any]], message: Callable[[httpx.Response], str], says: str
) -> None:
    path, body = request_
    async with upstream_and_front(tmp_path, TABLES, fake=DeepUpstream()) as (_, front):
        async with httpx.AsyncClient(timeout=30, headers=ANTHROPIC) as c:
            r = await c.post(front + path, json=body)
            talks = await c.post(front + "/v1/messages", json=_messages("talks")[1])
    assert r.status_code == 502, r.text
    assert says in message(r)
    # The router goes on serving.
    assert talks.status_code == 200 and talks.json()["content"] == [{"type": "text", "text": "Hello"}]


@pytest.mark.trio
async def test_a_deep_event_once_the_stream_has_begun_ends_it_with_an_error_event(tmp_path: Path) -> None:
    """Never a broken stream: the client reads the error in its own dialect's event."""
    async with upstream_and_front(tmp_path, TABLES, fake=DeepUpstream()) as (_, front):
        async with httpx.AsyncClient(timeout=30, headers=ANTHROPIC) as c:
            later = await c.post(front + "/v1/messages", json=_messages("deep_later", stream=True)[1])
    assert later.status_code == 200
    events = [line for line in later.text.splitlines() if line.startswith("event: ")]
    assert events[-1] == "event: error" and "event: message_stop" not in events
    assert "not JSON" in later.text and "Half" in later.text


@pytest.mark.trio
async def test_a_fleet_servers_models_nested_50000_deep_are_its_rows_error(tmp_path: Path) -> None:
    """GET /admin/fleet answers every server's row; this one's says why it has no models."""
    hc = HyperConfig()
    hc.bind = ["127.0.0.1:0"]
    async with trio.open_nursery() as nursery:
        (fake,) = await nursery.start(partial(serve, DeepUpstream(), hc))
        cfg = parse(f'[server]\nfleet = ["{fake}"]\n[models.near]\nupstream = "http://127.0.0.1:9/v1"\n', tmp_path)
        async with serving_http(Supervisor(cfg, worker_command=WORKER_COMMAND)) as front:
            async with httpx.AsyncClient(timeout=30) as c:
                fleet = await c.get(front + "/admin/fleet")
                again = await c.get(front + "/admin/models")
        nursery.cancel_scope.cancel()
    assert fleet.status_code == 200, fleet.text
    (host,) = fleet.json()["hosts"]
    assert host["url"] == fake and "not a Corral server's /admin/models" in host["error"]
    assert again.status_code == 200
