"""Ollama's API, driven by its official Python client (`ollama` on PyPI) against a real
`corral serve` with the demo model (issue 21: the dialect added through the seam).

The client's pydantic models are the check on every shape (ollama/_types.py); the
reference for behaviour is Ollama's docs/api.md. Where Corral differs on purpose, the test
says so: models are the config's (no pull), `digest` hashes the served model's name and the
file's path, size and time.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Iterator

import httpx
import ollama
import openai
import pytest

from tests.e2e.conftest import Server, start_server, stop_server

CONFIG = """
[server]
port = {PORT}

[supervisor]
idle_timeout = 0

[models.chat-a]
path = "{MODEL}"
aliases = ["gemma"]
slots = 2
n_ctx = 2048
chat_template = "gemma"

[models.chat-b]
path = "{MODEL}"
slots = 1
n_ctx = 1024
chat_template = "gemma"

[models.embed]
path = "{MODEL}"
embeddings = true
slots = 2
n_ctx = 1024
"""
GREEDY = {"temperature": 0, "num_predict": 12}
HI = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("ollama"), CONFIG)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


def test_list_and_show_describe_the_configured_models(client: ollama.Client) -> None:
    listed = {m.model: m for m in client.list().models}
    assert set(listed) == {"chat-a:latest", "gemma:latest", "chat-b:latest", "embed:latest"}
    m = listed["chat-a:latest"]
    assert m.details is not None and m.details.format == "gguf" and m.details.family == "gemma3"
    assert m.details.quantization_level == "Q4_K_M" and m.details.parameter_size == "270M"
    assert m.size is not None and m.size > 100_000_000 and m.digest is not None and len(m.digest) == 64
    shown = client.show("chat-a")  # without the tag, as with it
    assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "gemma3"
    assert shown.capabilities == ["completion"] and shown.template == "gemma"
    assert "/" not in (shown.modelfile or "").split("FROM", 1)[1]  # never a path on the server
    assert client.show("embed:latest").capabilities == ["embedding"]


def test_a_digest_is_one_served_model_and_show_gives_the_servers_context(client: ollama.Client) -> None:
    """Issue 41, item 3. Three served models on one file had one digest, and the llm-ollama
    plugin (which merges entries of one digest, as Ollama's copies) refused the embedding
    model; an alias was not listed, so `llm -m gemma` was unknown. /api/show said the file's
    training context (32,768) where the server gives 2,048."""
    listed = {m.model: m for m in client.list().models}
    digests = {name: m.digest for name, m in listed.items()}
    assert len({digests["chat-a:latest"], digests["chat-b:latest"], digests["embed:latest"]}) == 3
    assert digests["gemma:latest"] == digests["chat-a:latest"]  # an alias is the same model
    assert client.show("gemma").capabilities == ["completion"]
    for name, n_ctx in (("chat-a", 2048), ("chat-b", 1024)):
        shown = client.show(name)
        assert shown.modelinfo is not None and shown.modelinfo["gemma3.context_length"] == n_ctx
        assert shown.parameters is not None and shown.parameters.split() == ["num_ctx", str(n_ctx)]


def test_a_chat_says_the_same_as_the_openai_route_for_the_same_request(
    client: ollama.Client, server: Server
) -> None:
    """One internal request, two dialects: greedy, the same tokens. A prompt decoded
    afresh and one found in the prefix cache can differ in the last bits of their logits
    (llama.cpp's batch shapes differ), and the demo model's greedy choice with them, so a
    first request warms the cache and both answers are served from it."""
    warm = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    warm.chat.completions.create(model="chat-a", messages=HI, temperature=0, max_tokens=1)  # type: ignore[arg-type]
    r = client.chat(model="chat-a", messages=HI, options=GREEDY)
    assert r.message.role == "assistant" and r.message.content and r.done is True
    assert r.done_reason in ("stop", "length") and r.eval_count is not None and 0 < r.eval_count <= 12
    assert r.prompt_eval_count is not None and r.prompt_eval_count > 5
    assert r.total_duration is not None and r.eval_duration is not None and r.total_duration >= r.eval_duration > 0
    oa = warm.chat.completions.create(
        model="chat-a", messages=HI, temperature=0, max_tokens=12  # type: ignore[arg-type]
    )
    assert oa.choices[0].message.content == r.message.content
    assert oa.usage is not None and (oa.usage.prompt_tokens, oa.usage.completion_tokens) == (r.prompt_eval_count, r.eval_count)


def test_a_streamed_chat_is_the_whole_one_in_pieces(client: ollama.Client) -> None:
    client.chat(model="chat-a", messages=HI, options=GREEDY)  # the prefix cache warmed, as above
    whole = client.chat(model="chat-a", messages=HI, options=GREEDY)
    parts = list(client.chat(model="chat-a", messages=HI, options=GREEDY, stream=True))
    assert len(parts) > 2 and all(p.message.role == "assistant" for p in parts)
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == whole.done_reason and parts[-1].eval_count == whole.eval_count


def test_generate_renders_the_prompt_in_the_template_and_raw_does_not(client: ollama.Client) -> None:
    client.chat(model="chat-a", messages=[{"role": "user", "content": "Say hi"}], options=GREEDY)  # warm
    chat = client.chat(model="chat-a", messages=[{"role": "user", "content": "Say hi"}], options=GREEDY)
    gen = client.generate(model="chat-a", prompt="Say hi", options=GREEDY)
    assert gen.response == chat.message.content and gen.done_reason == chat.done_reason
    streamed = list(client.generate(model="chat-a", prompt="Say hi", options=GREEDY, stream=True))
    assert "".join(p.response or "" for p in streamed) == gen.response
    raw = client.generate(model="chat-a", prompt="The capital of France is", raw=True, options=GREEDY)
    assert raw.response and raw.prompt_eval_count is not None and raw.prompt_eval_count < chat.prompt_eval_count  # type: ignore[operator]


def test_format_constrains_the_reply_to_json(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    r = client.chat(
        model="chat-a", messages=[{"role": "user", "content": "Pick a colour."}], format=schema,
        options={"temperature": 0, "num_predict": 40},
    )
    if r.done_reason == "stop":
        assert isinstance(json.loads(r.message.content or ""), dict)
        assert "colour" in json.loads(r.message.content or "")
    else:  # cut at num_predict: still the start of an object of that schema
        assert (r.message.content or "").startswith('{')


def test_options_are_checked_and_an_error_names_the_option(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat(model="chat-a", messages=HI, options={"temperature": 5})
    assert exc.value.status_code == 400 and "options.temperature" in exc.value.error
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat(model="chat-a", messages=[{"role": "user", "content": "x", "images": ["aGk="]}])
    assert exc.value.status_code == 400 and "images" in exc.value.error
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat(model="no-such-model", messages=HI)
    assert exc.value.status_code == 404
    # num_ctx and the other runner options are the config's: accepted, left alone.
    r = client.chat(model="chat-a", messages=HI, options={**GREEDY, "num_ctx": 8192, "num_gpu": 0})
    assert r.done is True


def test_embed_gives_normalized_vectors_and_cuts_dimensions(client: ollama.Client) -> None:
    e = client.embed(model="embed", input=["hello", "world"])
    assert len(e.embeddings) == 2 and len(e.embeddings[0]) == 640
    assert sum(x * x for x in e.embeddings[0]) == pytest.approx(1.0, abs=1e-4)
    assert e.prompt_eval_count is not None and e.prompt_eval_count > 0
    cut = client.embed(model="embed", input="hello", dimensions=8)
    assert len(cut.embeddings[0]) == 8 and sum(x * x for x in cut.embeddings[0]) == pytest.approx(1.0, abs=1e-4)
    one = client.embeddings(model="embed", prompt="hello")
    assert one.embedding == pytest.approx(e.embeddings[0], abs=1e-5)
    with pytest.raises(ollama.ResponseError) as exc:
        client.embed(model="chat-a", input="hello")
    assert exc.value.status_code == 400


def _state(server: Server, model: str) -> str:
    models = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    return str(next(m["state"] for m in models if m["id"] == model))


def _until(server: Server, model: str, state: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while _state(server, model) != state:
        assert time.monotonic() < deadline, f"{model} never became {state}"
        time.sleep(0.1)


def test_keep_alive_is_the_models_idle_time_from_that_request(client: ollama.Client, server: Server) -> None:
    """The config says never unload (idle_timeout = 0); a request's keep_alive wins."""
    r = client.chat(model="chat-b", messages=HI, options=GREEDY, keep_alive=0)
    assert r.done is True
    _until(server, "chat-b", "stopped")
    assert "chat-b:latest" not in {m.model for m in client.ps().models}
    # An empty chat loads the model (Ollama's way to warm one), with the keep_alive asked.
    loaded = client.chat(model="chat-b", messages=[], keep_alive="10m")
    assert loaded.done_reason == "load" and _state(server, "chat-b") == "ready"
    (entry,) = [m for m in client.ps().models if m.model == "chat-b:latest"]
    assert entry.expires_at is not None
    left = entry.expires_at.timestamp() - time.time()
    assert 540 < left <= 600
    gone = client.generate(model="chat-b", prompt="", keep_alive=0)
    assert gone.done_reason == "unload"
    _until(server, "chat-b", "stopped")


def test_version_and_errors_on_unknown_paths_are_in_ollamas_shape(server: Server) -> None:
    assert httpx.get(server.url + "/api/version").json()["version"].count(".") == 2
    r = httpx.post(server.url + "/api/pull", json={"model": "llama3"})
    assert r.status_code == 404 and set(r.json()) == {"error"}
    r = httpx.post(server.url + "/api/chat", content=b"{not json")
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_the_client_reads_a_stream_cut_by_a_dead_worker_as_an_error(client: ollama.Client, server: Server) -> None:
    """A stream whose worker dies mid-answer ends with an error line, which the client
    raises, rather than ending as if whole."""
    got: list[Any] = []
    with pytest.raises(ollama.ResponseError):
        for part in client.chat(model="chat-a", messages=HI, options={"temperature": 0, "num_predict": 400}, stream=True):
            got.append(part)
            if len(got) == 3:
                os.kill(server.workers()["chat-a"], signal.SIGKILL)
    assert 3 <= len(got) and not any(p.done for p in got)


def test_an_input_too_long_is_cut_unless_truncate_is_false(client: ollama.Client, server: Server) -> None:
    """Ollama's `truncate` defaults to true: the end of a long input is cut to fit."""
    long = "word " * 3000
    cut = client.embed(model="embed", input=long)
    assert len(cut.embeddings) == 1 and cut.prompt_eval_count is not None and 0 < cut.prompt_eval_count <= 1024
    with pytest.raises(ollama.ResponseError) as exc:
        client.embed(model="embed", input=long, truncate=False)
    assert exc.value.status_code == 400 and "input" in exc.value.error
    r = httpx.post(server.url + "/api/embed", json={"model": "embed", "input": ["a"] * 129}, timeout=30)
    assert r.status_code == 400 and "'input'" in r.json()["error"]


def test_found_on_probing_keep_alive_and_model_names(client: ollama.Client, server: Server) -> None:
    """What a hostile probe of the first version found: a keep_alive of centuries broke
    /api/ps (500); `ollama stop` (an empty generate with keep_alive 0) was a 400 on an
    embedding model; /api/embeddings loaded the model before refusing a bad keep_alive; a
    404 named the model without the tag the client sent."""
    client.chat(model="chat-b", messages=[], keep_alive=1e12)
    (entry,) = [m for m in client.ps().models if m.model == "chat-b:latest"]
    assert entry.expires_at is not None and entry.expires_at.year == 9999
    client.embed(model="embed", input="x")  # loaded
    assert client.generate(model="embed", prompt="", keep_alive=0).done_reason == "unload"
    _until(server, "embed", "stopped")
    r = httpx.post(server.url + "/api/embeddings", json={"model": "embed", "prompt": "x", "keep_alive": "bogus"})
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]
    assert _state(server, "embed") == "stopped"
    for name in ("chat-a:7b", "nope:latest"):
        with pytest.raises(ollama.ResponseError) as exc:
            client.chat(model=name, messages=HI)
        assert exc.value.status_code == 404 and name in exc.value.error
    r = httpx.post(server.url + "/api/chat", content=b"nul")
    assert r.status_code == 400 and "Ollama API" in r.json()["error"]
    client.chat(model="chat-b", messages=[], keep_alive=0)
    _until(server, "chat-b", "stopped")
