"""Anthropic's Messages API (issue 23), driven by the official `anthropic` SDK against a real
`corral serve` with the demo model. The SDK's own types validate every answer and event
(warnings are errors here: a field of the wrong type warns); the references are
Anthropic's API reference and llama-server's /v1/messages (tools/server/server-chat.cpp).

The tool loop runs through a template with native tools (Qwen3's, tests/fixtures): the
call is forced (tool_choice any), its result goes back as a tool_result block, and the
final answer is held to a small JSON schema (output_config.format) so that the demo model,
a base model that never stops by itself, ends its turn.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Iterator

import anthropic
import httpx
import pytest

from tests.e2e.conftest import ROOT, Server, start_server, stop_server

QWEN3 = ROOT / "tests" / "fixtures" / "templates" / "Qwen-Qwen3-0.6B.jinja"
CONFIG = f"""
[server]
port = {{PORT}}
default_model = "demo"
api_keys = [{{ key = "sk-alpha1", name = "a" }}, {{ key = "sk-small-key", name = "small", models = ["demo"] }}]
admin_keys = ["sk-admin-anthropic"]  # /metrics answers an admin key alone once api_keys are set

[supervisor]
idle_timeout = 0

[models.demo]
path = "{{MODEL}}"
aliases = ["small"]
slots = 2
n_ctx = 2048
chat_template = "gemma"

[models.tools]
path = "{{MODEL}}"
slots = 2
n_ctx = 4096
chat_template = "{QWEN3}"

[models.one]
path = "{{MODEL}}"
slots = 1
max_queue = 0
n_ctx = 1024
chat_template = "gemma"

[models.embed]
path = "{{MODEL}}"
embeddings = true
slots = 1
n_ctx = 512
"""
WEATHER: dict[str, Any] = {
    "name": "get_weather", "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
}
VERDICT: dict[str, Any] = {
    "type": "object", "properties": {"sky": {"type": "string", "enum": ["sunny", "rainy"]}}, "required": ["sky"],
}
GREEDY = {"temperature": 0}  # the SDK's create() takes no temperature any more: sent as extra_body


# The SDKs warn when a field has the wrong type: an error here.
pytestmark = pytest.mark.usefixtures("sdk_warnings_are_errors")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("anthropic"), CONFIG)
    yield srv
    assert stop_server(srv) == 0


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key="sk-alpha1", max_retries=0) as c:
        yield c


def test_a_message_whole_and_streamed_say_the_same(client: anthropic.Anthropic) -> None:
    ask: Any = [{"role": "user", "content": "Name a colour."}]
    raw = client.messages.with_raw_response.create(model="demo", max_tokens=12, messages=ask, extra_body=GREEDY)
    assert raw.headers["request-id"] == raw.headers["x-request-id"]
    m = raw.parse()
    assert m.type == "message" and m.role == "assistant" and m.model == "demo" and m.id.startswith("msg_")
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 12
    assert [b.type for b in m.content] == ["text"]
    with client.messages.stream(model="demo", max_tokens=12, messages=ask, extra_body=GREEDY) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert final.content[0].text == m.content[0].text  # type: ignore[union-attr]
    # The prompt, evaluated once, is read from the prefix cache the second time.
    total = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == total
    assert (final.usage.cache_read_input_tokens or 0) > 0


def test_a_tool_loop_through_a_template_with_native_tools(client: anthropic.Anthropic, server: Server) -> None:
    ask: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(
        model="tools", max_tokens=80, messages=ask, tools=[WEATHER], tool_choice={"type": "any"},
        system="You answer with tools.", extra_body=GREEDY,
    )
    assert first.stop_reason == "tool_use", first.content
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input, dict) and isinstance(call.input.get("city"), str)

    # The same request streamed: the call's input arrives as input_json_delta and adds up.
    with client.messages.stream(
        model="tools", max_tokens=80, messages=ask, tools=[WEATHER], tool_choice={"type": "any"},
        system="You answer with tools.", extra_body=GREEDY,
    ) as stream:
        deltas = [ev.delta.type for ev in stream if ev.type == "content_block_delta"]
        streamed = stream.get_final_message()
    assert "input_json_delta" in deltas
    assert [(b.type, getattr(b, "input", None)) for b in streamed.content] == [(b.type, getattr(b, "input", None)) for b in first.content]

    turn = ask + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C"}]},
    ]
    final = client.messages.create(
        model="tools", max_tokens=40, messages=turn, tools=[WEATHER], system="You answer with tools.",
        output_config={"format": {"type": "json_schema", "schema": VERDICT}}, extra_body=GREEDY,
    )
    assert final.stop_reason == "end_turn", final
    (text,) = [b for b in final.content if b.type == "text"]
    assert json.loads(text.text)["sky"] in ("sunny", "rainy")

    # The conversation renders as its OpenAI form does: the same tokens, through the same template.
    counted = client.messages.count_tokens(model="tools", messages=turn, tools=[WEATHER], system="You answer with tools.")
    chat = [
        {"role": "system", "content": "You answer with tools."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "".join(getattr(b, "text", "") for b in first.content) or "", "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"},
    ]
    tools = [{"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}}]
    r = httpx.post(
        server.base + "/chat/completions/input_tokens", headers={"Authorization": "Bearer sk-alpha1"},
        json={"model": "tools", "messages": chat, "tools": tools}, timeout=60,
    )
    assert r.status_code == 200 and counted.input_tokens == r.json()["input_tokens"]


def test_errors_are_anthropics_shape_naming_what_is_wrong(client: anthropic.Anthropic, server: Server) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert nf.value.body == {"type": "error", "error": {"type": "not_found_error", "message": "The model `nope` does not exist."}}
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="demo", max_tokens=5, messages=[{"role": "user", "content": "hi"}], extra_body={"temperature": 3})
    assert bad.value.body["error"]["type"] == "invalid_request_error" and "'temperature'" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as emb:
        client.messages.create(model="embed", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert "embeddings only" in emb.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as img:
        client.messages.create(model="demo", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert "messages[0].content[0]" in img.value.body["error"]["message"]
    # max_tokens is required, as in Anthropic's API; the body the SDK cannot send, sent raw.
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": "sk-alpha1"}, json={"model": "demo", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "'max_tokens'" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/messages/nope", headers={"x-api-key": "sk-alpha1"}, json={})
    assert r.status_code == 404 and r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"


def test_keys_come_as_x_api_key_or_bearer_and_keep_their_model_scopes(server: Server) -> None:
    with (
        anthropic.Anthropic(base_url=server.url, api_key="sk-wrong", max_retries=0) as bad,
        anthropic.Anthropic(base_url=server.url, auth_token="sk-alpha1", max_retries=0) as bearer,
        anthropic.Anthropic(base_url=server.url, api_key="sk-small-key", max_retries=0) as small,
    ):
        with pytest.raises(anthropic.AuthenticationError) as e:
            bad.messages.create(model="demo", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        assert e.value.body["error"]["type"] == "authentication_error"
        assert bearer.messages.create(model="demo", max_tokens=2, messages=[{"role": "user", "content": "hi"}]).usage.output_tokens == 2
        with pytest.raises(anthropic.NotFoundError):  # a model outside the key's scope does not exist for it
            small.messages.create(model="tools", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    r = httpx.post(
        server.url + "/v1/messages?beta=true", json={"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": "sk-alpha1", "anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219,effort-2025-11-24"},
    )
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 2


def test_the_slot_line_answers_429_in_anthropics_shape_and_metrics_count_the_route(server: Server) -> None:
    """`one` has one slot and no queue: a second request while the first streams is a 429."""
    holding = threading.Event()
    done = threading.Event()

    def hold() -> None:
        body = {"model": "one", "max_tokens": 300, "stream": True, "messages": [{"role": "user", "content": "Count."}]}
        with httpx.stream("POST", server.url + "/v1/messages", json=body, headers={"x-api-key": "sk-alpha1"}, timeout=120) as r:
            for _ in r.iter_lines():
                holding.set()
                if done.is_set():
                    break

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert holding.wait(60)
        r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": "sk-alpha1"},
                       json={"model": "one", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        assert r.headers["x-should-retry"] == "true" and "retry-after" in r.headers
    finally:
        done.set()
        t.join(60)
    metrics = httpx.get(server.url + "/metrics", headers={"x-api-key": "sk-admin-anthropic"}).text
    assert 'endpoint="/v1/messages",model="one",status="429"' in metrics
    assert 'endpoint="/v1/messages",model="demo",status="200"' in metrics


def test_aliases_and_the_default_model_serve_as_on_every_route(client: anthropic.Anthropic, server: Server) -> None:
    m = client.messages.create(model="small", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert m.model == "small"  # the name the client used, as OpenAI's routes answer it
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": "sk-alpha1"},
                   json={"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["model"] == "demo"
