"""Anthropic's, Responses' and Ollama's routes reaching a model whose upstream speaks only
OpenAI's API (issue 25, item 1: "the request is translated through the internal request
when the upstream speaks another dialect"), through the real app, against a fake
OpenAI-compatible upstream that streams chunks as llama-server and vLLM write them.

What is checked: what the upstream is sent (a chat completion, streamed with usage; the
client's parameters under OpenAI's names, and none the client left unset, since the
upstream's own defaults differ from Corral's), what the client gets back in its own
dialect (text, reasoning, a tool call whose arguments came in pieces, the upstream's
usage), and how the upstream's refusals and breaks reach it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.process.test_upstream_relay import request_body, upstream_and_front

CHUNK = "chat.completion.chunk"


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-1", "object": CHUNK, "created": 1, "model": "up", "choices": choices, **extra}


USAGE = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14, "prompt_tokens_details": {"cached_tokens": 4}}
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "talks": [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"reasoning_content": "The user greets."}),
        _chunk({"content": "Hello"}),
        _chunk({"content": " there"}),
        _chunk({}, "stop"),
        _chunk(None, usage=USAGE),
    ],
    # Busy, said in the stream after the role-only chunk llama-server and vLLM open with.
    "busy": [_chunk({"role": "assistant", "content": ""}),
             {"error": {"message": "model overloaded", "type": "server_error", "code": 503}}],
    # Whole over HTTP, [DONE] and all, but the choice never finished: a cut answer.
    "unfinished": [_chunk({"content": "Half"})],
    "writes": [  # a text completion's chunks
        {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "Once", "finish_reason": None}]},
        {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": " upon", "finish_reason": "length"}]},
        {"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": USAGE},
    ],
    "calls": [
        _chunk({"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": "call_w1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
        _chunk({}, "tool_calls"),
        _chunk(None, usage=USAGE),
    ],
}


class OpenAIUpstream:
    """Answers /v1/chat/completions by the upstream model's name: a script of chunks
    (SCRIPTS), a refusal ("refuses": 400 naming temperature; "badkey": 401), or a stream
    that breaks off after its first chunk ("cuts"). Records each request's path and body."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.gone = trio.Event()  # a client of "slow" went away mid-stream

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = await request_body(scope, receive, send)
        if body is None:
            return
        sent = json.loads(body) if body else {}
        self.seen.append((scope["path"], sent))
        model = sent.get("model")
        if scope["path"].endswith("/embeddings"):  # in reverse order: the index says where each goes
            vectors = [{"object": "embedding", "index": i, "embedding": [float(i), 0.5]} for i in range(len(sent["input"]))]
            answer = {"object": "list", "data": vectors[::-1][: 1 if model == "cuts" else None],
                      "usage": {"prompt_tokens": 7, "total_tokens": 7}}
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps(answer).encode()})
            return
        if model in ("refuses", "badkey"):
            status, error = (400, {"message": "temperature is out of range", "type": "invalid_request_error",
                                   "param": "temperature", "code": None}) if model == "refuses" else (
                401, {"message": "Incorrect API key provided", "type": "invalid_request_error"})
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps({"error": error}).encode()})
            return
        if model == "whole":  # a server that ignores stream: true
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"object": "chat.completion", "choices": []}'})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        if model == "cuts":
            first = _chunk({"content": "Half an"})
            await send({"type": "http.response.body", "body": f"data: {json.dumps(first)}\n\n".encode(), "more_body": True})
            raise RuntimeError("the upstream dies mid-answer")
        if model == "slow":
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, receive, nursery.cancel_scope)
                for i in range(200):
                    chunk = _chunk({"content": f"w{i} "})
                    await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                                "more_body": True})
                    await trio.sleep(0.05)
            return
        for chunk in SCRIPTS.get(model, []):
            await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


    async def _watch(self, receive: Any, scope: trio.CancelScope) -> None:
        if (await receive())["type"] == "http.disconnect":
            self.gone.set()
            scope.cancel()


def _tables(*names: str) -> str:
    return "".join(f'[models.{n}]\nupstream = "{{UP}}"\nupstream_model = "{n}"\n' for n in names) + (
        '[models.both]\nupstream = "{UP}"\nupstream_dialects = ["openai", "anthropic"]\n'
    )


TABLES = _tables("talks", "writes", "busy", "calls", "refuses", "badkey", "cuts", "slow", "unfinished", "whole")
ANTHROPIC = {"anthropic-version": "2023-06-01"}


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        out.append((lines.get("event", ""), json.loads(lines["data"])))
    return out


@pytest.mark.trio
async def test_anthropic_messages_reach_an_openai_upstream_translated(tmp_path: Path) -> None:
    async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10, headers=ANTHROPIC) as c:
            r = await c.post(front + "/v1/messages", json={
                "model": "talks", "max_tokens": 64, "temperature": 0.8, "system": "Be brief.",
                "messages": [{"role": "user", "content": "Hi"}],
            })
            assert r.status_code == 200, r.text
            message = r.json()
            streamed = await c.post(front + "/v1/messages", json={
                "model": "talks", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Hi"}],
            })
    path, sent = fake.seen[0]
    assert path == "/v1/chat/completions"
    # Corral's own default temperature is 0.8 too: sent, because the client set it.
    assert sent == {
        "model": "talks", "max_tokens": 64, "temperature": 0.8,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "stream": True, "stream_options": {"include_usage": True},
    }
    # Nothing the client left unset: the upstream's defaults apply, not Corral's.
    assert set(fake.seen[1][1]) == {"model", "max_tokens", "messages", "stream", "stream_options"}
    assert message["content"] == [
        {"type": "thinking", "thinking": "The user greets.", "signature": message["content"][0].get("signature", "")},
        {"type": "text", "text": "Hello there"},
    ]
    assert message["stop_reason"] == "end_turn" and message["model"] == "talks"
    assert message["usage"]["output_tokens"] == 3
    assert message["usage"]["input_tokens"] + message["usage"].get("cache_read_input_tokens", 0) == 11
    kinds = [k for k, _ in _events(streamed.text)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    text = "".join(d["delta"].get("text", "") for k, d in _events(streamed.text) if k == "content_block_delta")
    assert text == "Hello there"


@pytest.mark.trio
async def test_a_tool_call_in_pieces_reaches_every_dialect_whole(tmp_path: Path) -> None:
    tool = {"name": "get_weather", "description": "Weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    fn = {"type": "function", "function": {"name": "get_weather", "parameters": tool["input_schema"]}}
    async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10, headers=ANTHROPIC) as c:
            anthropic = (await c.post(front + "/v1/messages", json={
                "model": "calls", "max_tokens": 64, "tools": [tool], "tool_choice": {"type": "tool", "name": "get_weather"},
                "messages": [{"role": "user", "content": "Weather in Paris?"}],
            })).json()
            ollama = (await c.post(front + "/api/chat", json={
                "model": "calls", "stream": False, "tools": [fn], "messages": [{"role": "user", "content": "Paris?"}],
            })).json()
            responses = (await c.post(front + "/v1/responses", json={
                "model": "calls", "input": "Paris?", "tools": [{"type": "function", "name": "get_weather",
                                                               "parameters": tool["input_schema"]}],
            })).json()
    sent = fake.seen[0][1]
    assert sent["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather", "parameters": tool["input_schema"]}}]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    (use,) = anthropic["content"]
    assert (use["type"], use["name"], use["input"], use["id"]) == ("tool_use", "get_weather", {"city": "Paris"}, "call_w1")
    assert anthropic["stop_reason"] == "tool_use"
    fn_called = ollama["message"]["tool_calls"][0]["function"]
    assert (fn_called["name"], fn_called["arguments"]) == ("get_weather", {"city": "Paris"})
    (call,) = [o for o in responses["output"] if o["type"] == "function_call"]
    assert (call["name"], json.loads(call["arguments"]), call["call_id"]) == ("get_weather", {"city": "Paris"}, "call_w1")


@pytest.mark.trio
async def test_responses_keep_their_conversation_in_the_front(tmp_path: Path) -> None:
    """previous_response_id is the front's own store: the second turn reaches the upstream
    with the first turn's messages before its own."""
    async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            first = (await c.post(front + "/v1/responses", json={
                "model": "talks", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 32,
            })).json()
            second = await c.post(front + "/v1/responses", json={
                "model": "talks", "input": "And again?", "previous_response_id": first["id"], "stream": True,
            })
    assert second.status_code == 200
    texts = [o for o in first["output"] if o["type"] == "message"][0]["content"][0]["text"]
    assert texts == "Hello there" and first["usage"]["input_tokens"] == 11
    # Nothing was sent for them: the upstream chose, and the front does not pretend to know.
    assert first["temperature"] is None and first["top_p"] is None
    sent = fake.seen[1][1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"] and sent[1]["content"] == "Hello there"
    assert fake.seen[0][1]["max_tokens"] == 32 and "max_tokens" not in fake.seen[1][1]
    assert "response.completed" in second.text


@pytest.mark.trio
async def test_ollama_chat_and_generate_reach_an_openai_upstream(tmp_path: Path) -> None:
    async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            lines = (await c.post(front + "/api/chat", json={
                "model": "talks", "messages": [{"role": "user", "content": "Hi"}],
                "options": {"temperature": 0.2, "top_k": 5, "num_predict": 20, "seed": 3},
            })).text.strip().split("\n")
            generated = (await c.post(front + "/api/generate", json={
                "model": "talks", "prompt": "Hi", "system": "Be brief.", "stream": False,
            })).json()
            loaded = (await c.post(front + "/api/generate", json={"model": "talks"})).json()
    chunks = [json.loads(line) for line in lines]
    assert "".join(ch["message"].get("content", "") for ch in chunks) == "Hello there"
    assert "".join(ch["message"].get("thinking", "") for ch in chunks) == "The user greets."
    assert chunks[-1]["done"] is True and chunks[-1]["eval_count"] == 3 and chunks[-1]["prompt_eval_count"] == 11
    sent = fake.seen[0][1]
    assert {k: sent[k] for k in ("temperature", "top_k", "max_tokens", "seed")} == {
        "temperature": 0.2, "top_k": 5, "max_tokens": 20, "seed": 3}
    assert "top_p" not in sent and "min_p" not in sent and "repeat_penalty" not in sent
    assert generated["response"] == "Hello there" and generated["done_reason"] == "stop"
    assert fake.seen[1][1]["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert loaded["done"] is True and len(fake.seen) == 2  # nothing to load: no request upstream


@pytest.mark.trio
async def test_the_upstreams_refusals_and_breaks_reach_the_client_in_its_dialect(tmp_path: Path) -> None:
    async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10, headers=ANTHROPIC) as c:
            user = [{"role": "user", "content": "Hi"}]
            refused = await c.post(front + "/v1/messages", json={"model": "refuses", "max_tokens": 8, "messages": user})
            badkey = await c.post(front + "/api/chat", json={"model": "badkey", "messages": user})
            cut = await c.post(front + "/v1/messages", json={"model": "cuts", "max_tokens": 8, "messages": user, "stream": True})
            cut_whole = await c.post(front + "/v1/messages", json={"model": "cuts", "max_tokens": 8, "messages": user})
            counted = await c.post(front + "/v1/messages/count_tokens", json={"model": "talks", "messages": user})
            native = await c.post(front + "/tokenize", json={"model": "talks", "content": "Hi"})
            unfinished = await c.post(front + "/api/chat", json={"model": "unfinished", "messages": user, "stream": False})
            whole = await c.post(front + "/api/chat", json={"model": "whole", "messages": user, "stream": False})
            replicas = {u["name"]: u["replicas"][0] for u in (await c.get(front + "/admin/models")).json()["upstreams"]}
            # A client error found by the route is Corral's own 400, before anything is sent.
            n = len(fake.seen)
            bad = await c.post(front + "/v1/messages", json={"model": "talks", "max_tokens": 8, "messages": []})
            assert len(fake.seen) == n
    assert refused.status_code == 400 and refused.json()["type"] == "error"
    assert "temperature is out of range" in refused.json()["error"]["message"]
    # The upstream refused the configured key: the operator's to fix, not the client's key.
    assert badkey.status_code == 502 and "api_key_env" in badkey.json()["error"]
    kinds = [k for k, _ in _events(cut.text)]
    assert cut.status_code == 200 and kinds[-1] == "error" and "message_stop" not in kinds
    assert cut_whole.status_code == 502
    assert counted.status_code == 400 and "count" in counted.json()["error"]["message"]
    assert native.status_code == 400 and "`talks`" in native.json()["error"]["message"]
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
    # An answer that is not whole counts against its replica, as a broken connection does.
    assert unfinished.status_code == 502 and "before it was complete" in unfinished.json()["error"]
    assert replicas["unfinished"]["requests"] == {"failed": 1}
    assert "before it was complete" in replicas["unfinished"]["last_error"]
    assert whole.status_code == 502 and "not server-sent events" in whole.json()["error"]
    assert replicas["whole"]["requests"] == {"failed": 1}
    assert replicas["cuts"]["requests"] == {"failed": 2} and replicas["talks"]["requests"].get("failed", 0) == 0


@pytest.mark.trio
async def test_a_client_that_leaves_mid_stream_ends_the_upstream_request(tmp_path: Path) -> None:
    async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10, headers=ANTHROPIC) as c:
            async with c.stream("POST", front + "/v1/messages", json={
                "model": "slow", "max_tokens": 500, "stream": True, "messages": [{"role": "user", "content": "Go"}],
            }) as r:
                got = 0
                async for _ in r.aiter_lines():
                    got += 1
                    if got > 12:
                        break
            with trio.fail_after(5):
                await fake.gone.wait()
            models = (await c.get(front + "/admin/models")).json()
    (slow,) = [u for u in models["upstreams"] if u["name"] == "slow"]
    assert slow["replicas"][0]["in_flight"] == 0


@pytest.mark.trio
async def test_an_upstream_that_speaks_the_dialect_still_gets_it_as_it_came(tmp_path: Path) -> None:
    async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10, headers=ANTHROPIC) as c:
            await c.post(front + "/v1/messages", json={"model": "both", "max_tokens": 8, "messages": []})
    assert fake.seen == [("/v1/messages", {"model": "both", "max_tokens": 8, "messages": []})]


@pytest.mark.trio
async def test_ollamas_embeddings_reach_an_openai_upstream(tmp_path: Path) -> None:
    async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            embedded = (await c.post(front + "/api/embed", json={"model": "talks", "input": ["a", "b", "c"]})).json()
            legacy = (await c.post(front + "/api/embeddings", json={"model": "talks:latest", "prompt": "a"})).json()
            short = await c.post(front + "/api/embed", json={"model": "cuts", "input": ["a", "b"]})
            empty = (await c.post(front + "/api/embed", json={"model": "talks", "input": []})).json()
    assert fake.seen[0] == ("/v1/embeddings", {"model": "talks", "input": ["a", "b", "c"], "encoding_format": "float"})
    # L2-normalised, as Ollama's are (the upstream's [x, 0.5] were not: the second probe
    # of issue 40 found them passed on as they came).
    unit = [[x / math.hypot(x, 0.5), 0.5 / math.hypot(x, 0.5)] for x in (0.0, 1.0, 2.0)]
    assert [v == pytest.approx(u) for v, u in zip(embedded["embeddings"], unit)] == [True] * 3
    assert embedded["prompt_eval_count"] == 7
    assert legacy == {"embedding": [0.0, 1.0]}
    # One vector for two inputs: refused, never passed on with one missing.
    assert short.status_code == 502 and "1 embeddings for 2 inputs" in short.json()["error"]
    assert empty["embeddings"] == [] and len(fake.seen) == 3


@pytest.mark.trio
async def test_llama_servers_completion_reaches_an_openai_upstream_as_a_text_completion(tmp_path: Path) -> None:
    """llama-server's /completion (its clients: llama.cpp's examples, older editor
    plugins) for a model whose upstream speaks only OpenAI's API: the text prompt goes as
    /v1/completions, with n_predict as max_tokens, and the answer is in llama-server's
    shape; a prompt of token ids, which name this server's vocabulary, is a 400."""
    async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10) as c:
            whole = await c.post(front + "/completion", json={"model": "writes", "prompt": "Tell", "n_predict": 2})
            streamed = await c.post(front + "/completions", json={"model": "writes", "prompt": "Tell", "stream": True})
            tokens = await c.post(front + "/completion", json={"model": "writes", "prompt": [1, 2, 3]})
            ids = await c.post(front + "/completion", json={"model": "writes", "prompt": "Tell", "return_tokens": True})
            probs = await c.post(front + "/completion", json={"model": "writes", "prompt": "Tell", "n_probs": 2})
    assert fake.seen[0] == ("/v1/completions", {
        "model": "writes", "prompt": "Tell", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}})
    answer = whole.json()
    assert whole.status_code == 200 and answer["content"] == "Once upon" and answer["stop"] is True
    assert (answer["stop_type"], answer["truncated"]) == ("limit", False)  # the client's n_predict, not the context
    assert (answer["tokens_predicted"], answer["tokens_evaluated"], answer["prompt"]) == (3, 11, "Tell")
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == "Once upon" and events[-1]["stop"] is True
    assert tokens.status_code == 400 and tokens.json()["error"]["type"] == "invalid_request_error"
    assert "prompt" in tokens.json()["error"]["message"] and len(fake.seen) == 2
    assert ids.status_code == 400 and "return_tokens" in ids.json()["error"]["message"]  # ids it cannot know
    # Named as the client sent it (n_probs), not by the job's field (logprobs).
    assert probs.status_code == 400 and probs.json()["error"]["message"].startswith("'n_probs' cannot be sent")
    assert len(fake.seen) == 2


@pytest.mark.trio
async def test_an_upstream_busy_before_its_first_output_is_a_503_to_retry(tmp_path: Path) -> None:
    """Found by probing: an error event after the role-only first chunk gave a 200 stream
    holding only an error (the official clients do not retry that), and a busy upstream
    counted as a broken replica."""
    async with upstream_and_front(tmp_path, TABLES, fake=OpenAIUpstream()) as (_, front):
        async with httpx.AsyncClient(timeout=10, headers=ANTHROPIC) as c:
            user = [{"role": "user", "content": "Hi"}]
            answers = [await c.post(front + "/v1/messages", json={"model": "busy", "max_tokens": 8, "messages": user,
                                                                  "stream": True}) for _ in range(4)]
            replicas = {u["name"]: u["replicas"][0] for u in (await c.get(front + "/admin/models")).json()["upstreams"]}
    assert all(a.status_code == 503 and a.json()["error"]["type"] == "overloaded_error" for a in answers)
    assert replicas["busy"]["healthy"] is True and "failed" not in replicas["busy"]["requests"]


async def test_a_keys_max_tokens_reaches_a_translated_upstream(tmp_path: Path) -> None:
    # Issue 40, finding 5: a key's output cap held on local models only; a request Corral
    # translates for an upstream is cut the same way (one relayed as it came is not read).
    key = "sk-corral-capped-key-0123456789"
    server = f'api_keys = [{{ key = "{key}", name = "capped", max_tokens = 3 }}]'
    async with upstream_and_front(tmp_path, TABLES, server=server, fake=OpenAIUpstream()) as (fake, front):
        async with httpx.AsyncClient(timeout=10, headers={**ANTHROPIC, "x-api-key": key}) as c:
            for asked in (32000, 2):
                r = await c.post(front + "/v1/messages", json={
                    "model": "talks", "max_tokens": asked, "messages": [{"role": "user", "content": "Hi"}],
                })
                assert r.status_code == 200, r.text
            r = await c.post(front + "/api/chat", json={"model": "talks", "stream": False, "messages": [{"role": "user", "content": "Hi"}]})
            assert r.status_code == 200, r.text
    assert [sent["max_tokens"] for _, sent in fake.seen] == [3, 2, 3]
