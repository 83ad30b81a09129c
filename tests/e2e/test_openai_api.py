"""The OpenAI surface with the real worker, through the official openai client."""

from __future__ import annotations

import base64
import concurrent.futures
import math
import struct

import httpx
import openai
import pytest

from tests.e2e.conftest import Server, pooled_briefly

GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    # Strict validation: every response and chunk must match the openai client's own types
    # (issue 10, item 7), not merely parse.
    return openai.OpenAI(
        base_url=server.base, api_key="unused", max_retries=0, http_client=pooled_briefly(),
        _strict_response_validation=True,
    )


@pytest.fixture(scope="module")
def lax(server: Server) -> openai.OpenAI:
    """For the two shapes that the openai client's own strict types refuse, from any server,
    OpenAI's included: a streamed text completion's chunks before the last carry
    `finish_reason: null` (the type allows only "stop", "length", "content_filter"), and a
    base64 embedding is a string (the type says a list of floats)."""
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, http_client=pooled_briefly())


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="chat-a", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12, **GREEDY
    )
    assert r.object == "chat.completion"
    assert isinstance(r.created, int)
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    # Two separate requests' greedy answers are compared: a prompt whose every token wins
    # by a wide margin (counting), since the cells' places in the unified cache move the
    # logits a little ("Tell me about cats." flipped "mendatang\n" / "mendatanguser" at a
    # near tie in a fresh-clone run).
    count = "Continue counting, separated by commas: 1, 2, 3, 4, 5, 6, 7, 8,"
    kw = dict(model="chat-a", messages=[{"role": "user", "content": count}], max_tokens=24, **GREEDY)
    whole = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_sse_ends_with_done(server: Server) -> None:
    body = {"model": "chat-a", "prompt": "One two three", "max_tokens": 5, "stream": True}
    with httpx.stream("POST", server.base + "/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)


def test_completions_both_ways(client: openai.OpenAI, lax: openai.OpenAI) -> None:
    kw = dict(model="chat-b", prompt="The capital of France is", max_tokens=10, **GREEDY)
    r = client.completions.create(**kw)
    assert r.object == "text_completion"
    assert r.usage.completion_tokens == 10 or r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in lax.completions.create(stream=True, **kw))
    assert streamed == r.choices[0].text


def test_max_tokens_gives_length(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="chat-a", prompt="Count: 1, 2, 3,", max_tokens=7, extra_body={"ignore_eos": True}, **GREEDY
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7


def test_stop_string_spanning_tokens(client: openai.OpenAI, lax: openai.OpenAI) -> None:
    # Counting: each next token wins by a wide margin, so the three requests below, whose
    # cells sit in other places of the unified cache and whose steps verify other drafts,
    # answer alike. "A list of fruits: apple, banana," did not: " pear" and " peach" were
    # a near tie that the cells' order tipped (a fresh-clone run, issue 24).
    kw = dict(model="chat-a", prompt="Counting: 1, 2, 3, 4,", max_tokens=40, **GREEDY)
    full = client.completions.create(extra_body={"ignore_eos": True}, **kw).choices[0].text
    assert len(full) > 20
    # A stop string that straddles token boundaries in the middle of the output.
    stop = full[8:14]
    assert stop.strip()
    cut = client.completions.create(stop=[stop], **kw).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.find(stop)]
    streamed = "".join(
        c.choices[0].text for c in lax.completions.create(stop=[stop], stream=True, **kw)
    )
    assert streamed == cut.text


def test_concurrent_greedy_equals_sequential(client: openai.OpenAI) -> None:
    """Continuous batching must not change results: four prompts of very different lengths
    (one over n_batch, so it is prefilled in chunks while the others generate), run one at a
    time and then together, give identical greedy text.

    The prompts ask the model to keep counting. Counting has wide logit
    margins, so the float differences that different batch shapes cause (llama.cpp's logits
    are not bit-identical across batch sizes) cannot flip a token, while a wrong position or
    a mixed-up KV sequence breaks the count at once.
    """
    spans = [(1, 6), (100, 160), (1, 300), (7, 40)]  # (1, 300) is ~900 tokens > n_batch
    prompts = [", ".join(str(n) for n in range(a, b)) + "," for a, b in spans]

    def run(p: str) -> str:
        return client.completions.create(
            model="chat-a", prompt=p, max_tokens=32, extra_body={"ignore_eos": True}, **GREEDY
        ).choices[0].text

    sequential = [run(p) for p in prompts]
    for (_, b), text in zip(spans, sequential):
        assert text.lstrip().startswith(str(b))  # the model really counts: the test has teeth
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(run, prompts))
    assert together == sequential


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))  # the vectors are unit length


def test_embeddings(client: openai.OpenAI, lax: openai.OpenAI) -> None:
    # The client asks for base64 unless told otherwise, which its strict types refuse.
    r = client.embeddings.create(
        model="embed", input=["a cat sat", "a cat sat", "stock prices fell"], encoding_format="float"
    )
    vecs = [d.embedding for d in r.data]
    assert [d.index for d in r.data] == [0, 1, 2]
    assert len(vecs[0]) == 640
    assert math.isclose(sum(x * x for x in vecs[0]), 1.0, rel_tol=1e-4)
    assert vecs[0] == pytest.approx(vecs[1], abs=1e-5)  # same input, same batch
    assert _cos(vecs[0], vecs[2]) < 0.9
    assert r.usage.prompt_tokens > 0
    # Embedded alone, in a batch of another shape: llama.cpp's float results vary slightly
    # with batch shape (measured cosine 0.9996), so compare directions, not elements.
    b64 = lax.embeddings.create(model="embed", input="a cat sat", encoding_format="base64")
    raw = base64.b64decode(b64.data[0].embedding)  # type: ignore[arg-type]
    alone = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert len(alone) == 640
    assert _cos(alone, vecs[0]) > 0.999


def test_tokenize_matches_usage(server: Server, client: openai.OpenAI) -> None:
    text = "The capital of France is"
    r = httpx.post(server.url + "/tokenize", json={"model": "chat-b", "content": text}, timeout=30)
    assert r.status_code == 200
    plain = r.json()["tokens"]
    with_bos = httpx.post(
        server.url + "/tokenize", json={"model": "chat-b", "content": text, "add_special": True}, timeout=30
    ).json()["tokens"]
    assert with_bos == [2, *plain]  # gemma's BOS
    # A completion of the same text reports the same prompt length.
    usage = client.completions.create(model="chat-b", prompt=text, max_tokens=1).usage
    assert usage.prompt_tokens == len(with_bos)


def test_errors_are_openai_json(server: Server, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert nf.value.body == {
        "message": "The model `nope` does not exist.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    with pytest.raises(openai.BadRequestError) as big:
        client.completions.create(model="chat-b", prompt="word " * 3000, max_tokens=4)
    assert big.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="chat-a", messages=[{"role": "user", "content": "x"}], temperature=7)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as wrong:
        client.embeddings.create(model="chat-a", input="x")
    assert wrong.value.body["param"] == "model"
    r = httpx.post(server.base + "/chat/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(server.base + "/nowhere", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
    r = httpx.get(server.base + "/chat/completions", timeout=10)
    assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_models_list_and_retrieve_under_strict_validation(client: openai.OpenAI) -> None:
    listed = client.models.list().data
    assert {m.id for m in listed} >= {"chat-a", "chat-b", "embed"}
    assert client.models.retrieve("a-alias").id == "chat-a"  # an alias names its model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
