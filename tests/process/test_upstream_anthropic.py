"""OpenAI's, Responses' and Ollama's chat routes reaching a model whose upstream speaks only
Anthropic's Messages API (issue 25, item 1: "the request is translated through the
internal request when the upstream speaks another dialect"; an OpenAI client in front of
api.anthropic.com, as LiteLLM's router serves one), through the real app, against a fake
upstream that streams events as Anthropic's streaming reference writes them.

What is checked: what the upstream is sent (a streamed Messages request with Anthropic's
headers and the configured key, `system` at the top, only what the client set, and the
`max_tokens` the API requires), what each client gets back in its own dialect (text,
thinking as reasoning, a tool call whose input came in pieces, the usage), and what
cannot be carried: a 400 naming the parameter, before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.generation.remote.anthropic_request import DEFAULT_MAX_TOKENS
from tests.process.test_upstream_relay import request_body, upstream_and_front


def _ev(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, **fields}


def _start(input_tokens: int = 7, cached: int = 4) -> dict[str, Any]:
    return _ev("message_start", message={
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-up", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "cache_read_input_tokens": cached, "output_tokens": 1},
    })


def _end(reason: str, output_tokens: int, word: str | None = None) -> list[dict[str, Any]]:
    return [
        _ev("message_delta", delta={"stop_reason": reason, "stop_sequence": word}, usage={"output_tokens": output_tokens}),
        _ev("message_stop"),
    ]


SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "talks": [
        _start(),
        _ev("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""}),
        _ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "A greeting."}),
        _ev("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "sig"}),
        _ev("content_block_stop", index=0),
        _ev("content_block_start", index=1, content_block={"type": "text", "text": ""}),
        _ev("ping"),
        _ev("content_block_delta", index=1, delta={"type": "text_delta", "text": "Hello"}),
        _ev("content_block_delta", index=1, delta={"type": "text_delta", "text": " there"}),
        _ev("content_block_stop", index=1),
        *_end("stop_sequence", 3, "END"),
    ],
    "calls": [
        _start(),
        _ev("content_block_start", index=0, content_block={
            "type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {}}),
        _ev("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": '{"city": '}),
        _ev("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": '"Paris"}'}),
        _ev("content_block_stop", index=0),
        *_end("tool_use", 12),
    ],
    # Busy before it answers anything, as Anthropic's stream says so (HTTP 529's twin).
    # As it usually comes: after message_start and a ping, before any output.
    "busy": [_start(), _ev("ping"), _ev("error", error={"type": "overloaded_error", "message": "Overloaded"})],
    "empty": [],
    # The connection stays whole, but message_stop never comes: a cut answer.
    "unfinished": [_start(), _ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
                   _ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Half"})],
}
ERRORS: dict[str, tuple[int, str, str]] = {
    "refuses": (400, "invalid_request_error", "temperature: range: 0..1"),
    "overloaded": (529, "overloaded_error", "Overloaded"),
    "badkey": (401, "authentication_error", "invalid x-api-key"),
    "limited": (429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
}


class AnthropicUpstream:
    """Answers POST /v1/messages by the upstream model's name: a script of events, or
    an error in Anthropic's shape. Records each request's path, headers and body."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], dict[str, Any]]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = await request_body(scope, receive, send)
        if body is None:
            return
        sent = json.loads(body) if body else {}
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.seen.append((scope["path"], headers, sent))
        model = sent.get("model", "")
        if scope["method"] == "GET" and scope["path"] == "/v1/models":
            # As api.anthropic.com answers: every request needs the version header.
            ok = "anthropic-version" in headers
            status, answer = (200, {"data": [{"type": "model", "id": "talks"}], "has_more": False}) if ok else (
                400, {"type": "error", "error": {"type": "invalid_request_error",
                                                 "message": "anthropic-version: header is required"}})
            await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps(answer).encode()})
            return
        if scope["path"] == "/v1/messages/count_tokens" and model not in ERRORS:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps({"input_tokens": 42}).encode()})
            return
        if scope["path"] != "/v1/messages" or model in ERRORS:
            status, kind, message = ERRORS.get(model, (404, "not_found_error", f"Not found: {scope['path']}"))
            wait = [(b"retry-after", b"7")] if status == 429 else []
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"), *wait]})
            await send({"type": "http.response.body",
                        "body": json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for ev in SCRIPTS.get(model, []):
            wire = f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()
            await send({"type": "http.response.body", "body": wire, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


TABLES = "".join(
    f'[models.{n}]\nupstream = "{{UP}}"\nupstream_model = "{n}"\nupstream_dialects = ["anthropic"]\n'
    f'api_key_env = "CORRAL_TEST_UPSTREAM_KEY"\n'
    for n in ("talks", "calls", "unfinished", "refuses", "overloaded", "badkey", "busy", "empty", "limited")
)
USER = [{"role": "user", "content": "Hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_UPSTREAM_KEY", "sk-ant-test")


def _sse(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line[6:] != "[DONE]"]


@pytest.mark.trio
async def test_openai_chat_reaches_an_anthropic_upstream_translated(tmp_path: Path) -> None:
    async with upstream_and_front(tmp_path, TABLES, fake=AnthropicUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            whole = await c.post(front + "/v1/chat/completions", json={
                "model": "talks", "temperature": 0.5, "stop": ["END"],
                "messages": [{"role": "system", "content": "Be brief."}, *USER],
            })
            streamed = await c.post(front + "/v1/chat/completions", json={
                "model": "talks", "stream": True, "stream_options": {"include_usage": True}, "messages": USER,
            })
    path, headers, sent = fake.seen[0]
    assert path == "/v1/messages"
    assert headers["x-api-key"] == "sk-ant-test" and headers["anthropic-version"] == "2023-06-01"
    assert sent == {
        "model": "talks", "system": "Be brief.", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_tokens": DEFAULT_MAX_TOKENS, "temperature": 0.5, "stop_sequences": ["END"], "stream": True,
    }
    assert set(fake.seen[1][2]) == {"model", "messages", "max_tokens", "stream"}  # nothing the client left unset
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    message = answer["choices"][0]["message"]
    assert message["content"] == "Hello there" and message["reasoning_content"] == "A greeting."
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["model"] == "talks"
    # Anthropic's input_tokens leave out the cached 4; OpenAI's prompt_tokens count them.
    assert answer["usage"]["prompt_tokens"] == 11 and answer["usage"]["completion_tokens"] == 3
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 4
    chunks = _sse(streamed.text)
    assert "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"]) == "Hello there"
    assert [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 3


@pytest.mark.trio
async def test_a_tool_call_reaches_each_dialect_and_its_result_goes_back_as_a_tool_result(tmp_path: Path) -> None:
    async with upstream_and_front(tmp_path, TABLES, fake=AnthropicUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            chat = (await c.post(front + "/v1/chat/completions", json={
                "model": "calls", "messages": USER, "tools": [WEATHER], "tool_choice": "required",
                "parallel_tool_calls": False,
            })).json()
            ollama = (await c.post(front + "/api/chat", json={
                "model": "calls", "messages": USER, "tools": [WEATHER], "stream": False})).json()
            responses = (await c.post(front + "/v1/responses", json={
                "model": "calls", "input": "Weather?", "tools": [{"type": "function", **WEATHER["function"]}]})).json()
            await c.post(front + "/v1/chat/completions", json={"model": "talks", "tools": [WEATHER], "messages": [
                *USER, chat["choices"][0]["message"], {"role": "tool", "tool_call_id": "toolu_01", "content": "Sunny"}]})
    call = chat["choices"][0]["message"]["tool_calls"][0]
    assert (call["id"], call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "toolu_01", "get_weather", {"city": "Paris"})
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    sent = fake.seen[0][2]
    assert sent["tools"] == [{"name": "get_weather", "description": "The weather",
                              "input_schema": WEATHER["function"]["parameters"]}]
    # "required" with one tool offered: that tool, which is what "any" would mean there.
    assert sent["tool_choice"] == {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    function = ollama["message"]["tool_calls"][0]["function"]
    assert (function["name"], function["arguments"]) == ("get_weather", {"city": "Paris"})
    (item,) = [o for o in responses["output"] if o["type"] == "function_call"]
    assert (item["name"], json.loads(item["arguments"])) == ("get_weather", {"city": "Paris"})
    assert fake.seen[3][2]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny"}]},
    ]


@pytest.mark.trio
async def test_what_cannot_be_carried_and_what_the_upstream_refuses_reach_the_client_in_its_dialect(
    tmp_path: Path,
) -> None:
    async with upstream_and_front(tmp_path, TABLES, fake=AnthropicUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            refused = await c.post(front + "/v1/chat/completions", json={"model": "refuses", "temperature": 1.5, "messages": USER})
            overloaded = await c.post(front + "/api/chat", json={"model": "overloaded", "messages": USER, "stream": False})
            badkey = await c.post(front + "/v1/chat/completions", json={"model": "badkey", "messages": USER})
            unfinished = await c.post(front + "/v1/chat/completions", json={"model": "unfinished", "messages": USER, "stream": True})
            n = len(fake.seen)
            # Refused here, naming what the Messages API lacks, before anything is sent.
            penalty = await c.post(front + "/v1/chat/completions", json={"model": "talks", "presence_penalty": 1, "messages": USER})
            json_mode = await c.post(front + "/v1/chat/completions", json={
                "model": "talks", "response_format": {"type": "json_object"}, "messages": USER})
            text = await c.post(front + "/v1/completions", json={"model": "talks", "prompt": "Once"})
            embed = await c.post(front + "/api/embed", json={"model": "talks", "input": ["a"]})
            # Each named as its client wrote it, not by the job's field (seed, max_tokens).
            seed = await c.post(front + "/api/chat", json={
                "model": "talks", "messages": USER, "stream": False, "options": {"seed": 3}})
            budget = await c.post(front + "/v1/responses", json={
                "model": "talks", "input": "hi", "reasoning": {"effort": "high"}, "max_output_tokens": 100})
            sent_nothing = len(fake.seen) == n
            # The Anthropic route itself is relayed as it came: the upstream speaks it.
            native = await c.post(front + "/v1/messages", headers={"anthropic-version": "2023-06-01"},
                                  json={"model": "talks", "max_tokens": 9, "messages": USER})
    assert refused.status_code == 400 and "temperature: range" in refused.json()["error"]["message"]
    assert overloaded.status_code == 503 and "Overloaded" in overloaded.json()["error"]
    assert badkey.status_code == 502 and "api_key_env" in badkey.json()["error"]["message"]
    assert unfinished.status_code == 200 and "error" in _sse(unfinished.text)[-1]
    assert sent_nothing
    assert penalty.status_code == 400 and penalty.json()["error"]["param"] == "presence_penalty"
    assert json_mode.status_code == 400 and json_mode.json()["error"]["param"] == "response_format"
    assert text.status_code == 400 and text.json()["error"]["param"] == "prompt"
    assert embed.status_code == 400 and "/api/embed" in embed.json()["error"]
    assert seed.status_code == 400 and seed.json()["error"].startswith("'options.seed' cannot be sent")
    assert budget.status_code == 400 and budget.json()["error"]["param"] == "max_output_tokens"
    assert budget.json()["error"]["message"].startswith("'max_output_tokens' must be above")
    assert native.status_code == 200 and fake.seen[-1][2] == {"model": "talks", "max_tokens": 9, "messages": USER}


@pytest.mark.trio
async def test_the_token_count_routes_ask_the_upstreams_count_tokens(tmp_path: Path) -> None:
    """Anthropic's API counts a conversation's tokens (POST /v1/messages/count_tokens), so
    the count routes of the other dialects are answered by it, sent the prompt only."""
    async with upstream_and_front(tmp_path, TABLES, fake=AnthropicUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            responses = await c.post(front + "/v1/responses/input_tokens", json={
                "model": "talks", "instructions": "Be brief.", "input": "Hi", "tools": [
                    {"type": "function", **WEATHER["function"]}], "temperature": 0.2})
            llama = await c.post(front + "/v1/chat/completions/input_tokens", json={"model": "talks", "messages": USER})
            refused = await c.post(front + "/v1/chat/completions/input_tokens", json={"model": "badkey", "messages": USER})
            limited = await c.post(front + "/v1/responses/input_tokens", json={"model": "limited", "input": "Hi"})
    assert responses.status_code == 200 and responses.json()["input_tokens"] == 42
    assert llama.status_code == 200 and llama.json()["input_tokens"] == 42
    path, headers, sent = fake.seen[0]
    assert path == "/v1/messages/count_tokens" and headers["anthropic-version"] == "2023-06-01"
    assert sent == {"model": "talks", "system": "Be brief.", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "tools": [
        {"name": "get_weather", "description": "The weather", "input_schema": WEATHER["function"]["parameters"]}]}
    assert refused.status_code == 502 and "api_key_env" in refused.json()["error"]["message"]
    assert limited.status_code == 429 and limited.headers["retry-after"] == "7"  # the upstream's wait, not ours



@pytest.mark.trio
async def test_a_failure_before_any_output_is_the_responses_status(tmp_path: Path) -> None:
    """Found by probing: an upstream that failed before its first event still started a
    200 stream holding only an error (the openai SDK's Responses stream raised "Expected
    to have received response.created"), and an overloaded_error took the replica out of
    rotation. Now the first event is awaited before the headers, as for a local model."""
    async with upstream_and_front(tmp_path, TABLES, fake=AnthropicUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            busy = [await c.post(front + "/v1/chat/completions", json={"model": "busy", "messages": USER, "stream": True})
                    for _ in range(4)]
            responses = await c.post(front + "/v1/responses", json={"model": "empty", "input": "Hi", "stream": True})
            replicas = {u["name"]: u["replicas"][0] for u in (await c.get(front + "/admin/models")).json()["upstreams"]}
    assert all(r.status_code == 503 and "Overloaded" in r.json()["error"]["message"] for r in busy)
    assert all(r.headers.get("retry-after") for r in busy)
    assert replicas["busy"]["healthy"] is True  # four times busy, never broken
    assert responses.status_code == 502 and "before it began" in responses.json()["error"]["message"]
    assert replicas["empty"]["requests"] == {"failed": 1}


@pytest.mark.trio
async def test_a_translated_request_carries_none_of_the_clients_dialect_headers(tmp_path: Path) -> None:
    """Found by probing: a client's anthropic-version and anthropic-beta reached the
    translated request, so a client could change the stream format the front reads, or
    turn a paid beta on with the operator's key. Its session header still goes."""
    async with upstream_and_front(tmp_path, TABLES, fake=AnthropicUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.post(front + "/v1/chat/completions", json={"model": "talks", "messages": USER}, headers={
                "anthropic-version": "1999-01-01", "anthropic-beta": "context-1m-2025-08-07", "openai-beta": "x",
                "x-session-id": "s1", "authorization": "Bearer client-key", "cookie": "a=b"})
    assert r.status_code == 200
    _, headers, _ = fake.seen[0]
    assert headers["anthropic-version"] == "2023-06-01" and headers["x-session-id"] == "s1"
    assert headers["x-api-key"] == "sk-ant-test" and headers["authorization"] == "Bearer sk-ant-test"
    assert not {"anthropic-beta", "openai-beta", "cookie"} & headers.keys()


@pytest.mark.trio
async def test_ollamas_model_list_names_the_models_its_chats_reach_translated(tmp_path: Path) -> None:
    async with upstream_and_front(tmp_path, TABLES, fake=AnthropicUpstream()) as (_, front):
        async with httpx.AsyncClient(timeout=10) as c:
            tags = (await c.get(front + "/api/tags")).json()
            chat = await c.post(front + "/api/chat", json={"model": "talks:latest", "messages": USER, "stream": False})
    assert {"talks:latest", "calls:latest"} <= {m["name"] for m in tags["models"]}
    assert chat.status_code == 200 and chat.json()["message"]["content"] == "Hello there"
