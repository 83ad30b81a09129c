"""A llama.cpp client's session against Corral (issue 10, item 6): llama-server's own routes
with the demo model, each answer checked against the shapes in llama-server's README
(tools/server/README.md), and its error shapes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import DEMO_MODEL, Server
from tests.e2e.test_kv_mixes import CANARY_TEXT

GREEDY = {"temperature": 0.0}
TIMINGS = {
    "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
    "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second",
}
FINAL = {
    "content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
    "generation_settings", "prompt", "stop_type", "stopping_word", "tokens_cached", "truncated", "timings",
}


@pytest.fixture(scope="module")
def http(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=120)


def complete(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post("/completion", json={"model": "chat-a", **GREEDY, **body})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def stream(http: httpx.Client, **body: Any) -> tuple[list[dict[str, Any]], str]:
    """The events of a streamed /completion, and the raw body."""
    r = http.post("/completion", json={"model": "chat-a", **GREEDY, **body, "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in r.text.splitlines() if line.startswith("data: ")]
    return events, r.text


def test_completion_with_n_predict_answers_in_llama_servers_shape(http: httpx.Client) -> None:
    out = complete(http, prompt="The capital of France is", n_predict=8, cache_prompt=True, id_slot=-1)
    assert FINAL <= out.keys()
    assert out["stop"] is True and out["model"] == "chat-a"
    assert isinstance(out["content"], str) and out["content"]
    assert 0 < out["tokens_predicted"] <= 8
    assert out["tokens_evaluated"] > 1
    assert out["tokens"] == []  # only with return_tokens
    assert out["stop_type"] in ("eos", "limit")
    if out["stop_type"] == "limit":
        assert out["tokens_predicted"] == 8
    assert out["stopping_word"] == "" and out["truncated"] is False
    assert out["prompt"] == "The capital of France is"
    assert TIMINGS <= out["timings"].keys()
    assert out["timings"]["predicted_n"] == out["tokens_predicted"]
    settings = out["generation_settings"]
    assert settings["n_predict"] == 8 and settings["n_ctx"] == 2048 and settings["temperature"] == 0.0
    assert 0 <= out["id_slot"] < 4


def test_return_tokens_gives_the_generated_ids(http: httpx.Client) -> None:
    out = complete(http, prompt="One, two, three,", n_predict=6, return_tokens=True)
    assert len(out["tokens"]) == out["tokens_predicted"]
    back = http.post("/detokenize", json={"model": "chat-a", "tokens": out["tokens"]}).json()["content"]
    if out["stop_type"] == "limit":
        assert back == out["content"]


def test_stream_sends_stop_false_events_then_one_final_with_timings_and_no_done(http: httpx.Client) -> None:
    # Two greedy answers compared: a prompt whose every token wins by a wide margin (2.2 or
    # more in log-probability). "Once upon a time" has a near tie at its fifth token (0.06:
    # "little" or "girl"), and llama.cpp's CPU logits move by up to 0.3 with the batch shape
    # and the KV cells' layout, so the second answer, which reuses the first one's cells,
    # once took the other word (a fresh clone's run, 2026-11-27).
    body = {"prompt": CANARY_TEXT, "n_predict": 12}
    whole = complete(http, **body)
    events, raw = stream(http, **body)
    assert "[DONE]" not in raw
    *partial, last = events
    assert partial, "at least one event before the final one"
    for ev in partial:
        assert ev["stop"] is False and isinstance(ev["content"], str) and len(ev["tokens"]) == 1
    assert last["stop"] is True and FINAL <= last.keys()
    assert TIMINGS <= last["timings"].keys() and last["timings"]["predicted_n"] == whole["tokens_predicted"]
    assert "".join(ev["content"] for ev in events) == whole["content"]
    assert last["stop_type"] == whole["stop_type"]


def test_timings_per_token_puts_timings_on_every_event(http: httpx.Client) -> None:
    events, _ = stream(http, prompt="Hello", n_predict=4, timings_per_token=True)
    assert all(TIMINGS <= ev["timings"].keys() for ev in events)


def test_a_stop_word_ends_with_stop_type_word(http: httpx.Client) -> None:
    base = complete(http, prompt="Count: 1, 2, 3, 4, 5,", n_predict=16, ignore_eos=True)
    words = base["content"].split()
    assert len(words) >= 3, base
    word = words[2]
    out = complete(http, prompt="Count: 1, 2, 3, 4, 5,", n_predict=16, ignore_eos=True, stop=[word])
    assert out["stop_type"] == "word" and out["stopping_word"] == word
    assert word not in out["content"]
    assert base["content"].startswith(out["content"])


def test_token_and_mixed_prompts_match_the_string_prompt(http: httpx.Client) -> None:
    text = "The sky is"
    ids = http.post("/tokenize", json={"model": "chat-a", "content": text, "add_special": True}).json()["tokens"]
    by_text = complete(http, prompt=text, n_predict=6)
    by_ids = complete(http, prompt=ids, n_predict=6)
    mixed = complete(http, prompt=[ids[0], text], n_predict=6)  # BOS as an id, then the text
    assert by_ids["content"] == by_text["content"] == mixed["content"]
    assert by_ids["tokens_evaluated"] == by_text["tokens_evaluated"] == len(ids)
    assert by_ids["prompt"].endswith(text)


def test_several_prompts_get_one_answer_each_in_order(http: httpx.Client) -> None:
    """llama.cpp's test_completion.py test_completion_with_tokens_input: `prompt` as a list
    of prompts (ids, strings, {prompt_string}) answers with a list, one result each; the
    same prompt in any form gives the same text. Streamed, each event names its `index`."""
    text = "I believe the meaning of life is"
    tokens = http.post("/tokenize", json={"model": "chat-a", "content": text, "add_special": True}).json()["tokens"]
    for prompt in ([tokens, tokens], [tokens, text], [tokens, {"prompt_string": text}]):
        r = http.post("/completion", json={"model": "chat-a", "prompt": prompt, "n_predict": 6, **GREEDY})
        assert r.status_code == 200, r.text
        out = r.json()
        assert isinstance(out, list) and [o["index"] for o in out] == [0, 1]
        assert out[0]["content"].split()[:1] == out[1]["content"].split()[:1]
        assert all(FINAL <= o.keys() for o in out)
    events, _ = stream(http, prompt=[text, "Once upon a time"], n_predict=4)
    finals = [e for e in events if e["stop"]]
    assert sorted(e["index"] for e in finals) == [0, 1]
    assert {e["index"] for e in events} == {0, 1}


def test_n_probs_gives_each_token_and_its_likeliest(http: httpx.Client) -> None:
    """llama.cpp's test_completion.py test_n_probs and test_n_probs_stream."""
    out = complete(http, prompt="I believe the meaning of life is", n_probs=10, n_predict=5)
    probs = out["completion_probabilities"]
    assert len(probs) == out["tokens_predicted"] == 5
    assert "".join(p["token"] for p in probs) == out["content"]
    for tok in probs:
        assert tok["id"] > 0 and tok["logprob"] <= 0.0 and isinstance(tok["bytes"], list)
        assert len(tok["top_logprobs"]) == 10
        assert tok["top_logprobs"][0]["id"] == tok["id"]  # greedy: the likeliest was taken
        assert all(p["logprob"] <= 0.0 and isinstance(p["token"], str) for p in tok["top_logprobs"])
    events, _ = stream(http, prompt="I believe the meaning of life is", n_probs=10, n_predict=5)
    steps = [e for e in events if not e["stop"]]
    assert steps and all(len(e["completion_probabilities"]) == len(e["tokens"]) for e in steps)
    r = http.post("/completion", json={"model": "chat-a", "prompt": "x", "n_probs": 3, "post_sampling_probs": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "post_sampling_probs"


def test_input_tokens_counts_the_chats_prompt(http: httpx.Client) -> None:
    """llama-server's /v1/chat/completions/input_tokens (server-context.cpp,
    handle_count_tokens): the chat's prompt tokens, as the chat itself reports them."""
    body = {"model": "chat-a", "messages": [{"role": "user", "content": "Count me, please."}], "max_tokens": 1}
    for path in ("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"):
        r = http.post(path, json=body)
        assert r.status_code == 200, r.text
        assert r.json()["object"] == "response.input_tokens"
        n = r.json()["input_tokens"]
        used = http.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
        assert n == used > 5
    assert http.get("/v1/health").json() == {"status": "ok"}


DOCUMENTS = ["A machine is a physical system.", "Learning is acquiring knowledge.",
             "Machine learning is a field of AI.", "Paris est une ville."]


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/reranking", "/v1/reranking"])
def test_rerank_answers_in_jina_and_tei_shapes(http: httpx.Client, path: str) -> None:
    """llama.cpp's test_rerank.py: test_rerank_top_n, test_rerank_tei_top_n, test_rerank_usage
    (the shapes; the demo model has no reranker head, so not its ranking)."""
    r = http.post(path, json={"model": "rank", "query": "Machine learning is", "documents": DOCUMENTS})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "list" and out["model"] == "rank"
    scores = [x["relevance_score"] for x in out["results"]]
    assert sorted(x["index"] for x in out["results"]) == [0, 1, 2, 3] and scores == sorted(scores, reverse=True)
    assert out["usage"]["prompt_tokens"] == out["usage"]["total_tokens"] > 4 * 5
    top = http.post(path, json={"model": "rank", "query": "q", "documents": DOCUMENTS, "top_n": 2,
                                "return_documents": True}).json()["results"]
    assert len(top) == 2 and all(x["document"]["text"] == DOCUMENTS[x["index"]] for x in top)
    tei = http.post(path, json={"model": "rank", "query": "q", "texts": DOCUMENTS, "top_n": 99, "return_text": True}).json()
    assert isinstance(tei, list) and len(tei) == 4 and all(x["text"] == DOCUMENTS[x["index"]] for x in tei)


@pytest.mark.parametrize("documents", [[], None, 123, [1, 2, 3]])
def test_rerank_refuses_bad_documents(http: httpx.Client, documents: Any) -> None:
    """test_rerank.py test_invalid_rerank_req; and a model that is not a reranker."""
    r = http.post("/rerank", json={"model": "rank", "query": "q", "documents": documents})
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents"
    r = http.post("/rerank", json={"model": "embed", "query": "q", "documents": ["a"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


@pytest.mark.parametrize("path", ["/embedding", "/embeddings"])
def test_native_embeddings_are_a_list_of_vector_lists(http: httpx.Client, path: str) -> None:
    """llama-server's native embeddings (server-task.cpp to_json_non_oaicompat): a bare
    list, `embedding` a list holding the pooled vector, unit length unless embd_normalize
    says otherwise (test_embedding.py test_embedding_multiple, and its `content` form)."""
    r = http.post(path, json={"model": "embed", "input": ["hello", [9906, "world"]]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [e["index"] for e in out] == [0, 1]
    for e in out:
        (vec,) = e["embedding"]
        assert len(vec) == 640 and sum(x * x for x in vec) == pytest.approx(1.0, abs=1e-4)
    raw = http.post(path, json={"model": "embed", "content": "hello", "embd_normalize": -1}).json()
    (vec,) = raw[0]["embedding"]
    assert sum(x * x for x in vec) != pytest.approx(1.0, abs=1e-3)
    # the unnormalised vector points where the normalised one does
    norm = sum(x * x for x in vec) ** 0.5
    assert [x / norm for x in vec] == pytest.approx(out[0]["embedding"][0], abs=1e-4)


def test_pooling_none_gives_a_vector_per_token_and_only_on_the_native_route(http: httpx.Client) -> None:
    """test_embedding.py test_embedding_pooling_none (a vector per token, not normalised)
    and test_embedding_pooling_none_oai (/v1/embeddings: 400)."""
    n = len(http.post("/tokenize", json={"model": "tokens", "content": "hello hello hello", "add_special": True}).json()["tokens"])
    r = http.post("/embeddings", json={"model": "tokens", "input": "hello hello hello"})
    assert r.status_code == 200, r.text
    vectors = r.json()[0]["embedding"]
    assert len(vectors) == n and all(len(v) == 640 for v in vectors)
    assert all(abs(sum(x * x for x in v) - 1) > 1e-6 for v in vectors)
    assert vectors[1] != vectors[2]  # each token's own state, not one vector repeated
    oai = http.post("/v1/embeddings", json={"model": "tokens", "input": "hello hello hello"})
    assert oai.status_code == 400 and "not OAI compatible" in oai.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [({}, "input"), ({"input": []}, "input"), ({"content": ""}, "content"), ({"input": "a", "embd_normalize": -2}, "embd_normalize")],
)
def test_native_embeddings_refuse_bad_input_naming_it(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    r = http.post("/embedding", json={"model": "embed", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and param in r.json()["error"]["message"]


def test_features_corral_lacks_answer_as_llama_server_with_them_off(http: httpx.Client) -> None:
    """tools/server/server.cpp: /cors-proxy and /tools are 403 feature_disabled without
    --webui-mcp-proxy and --tools; POST /props is 501 without --props
    (server-context.cpp post_props); /lora-adapters lists the adapters, none here."""
    for method, path in [("GET", "/cors-proxy"), ("POST", "/cors-proxy"), ("GET", "/tools"), ("POST", "/tools")]:
        r = http.request(method, path, json={})
        assert r.status_code == 403 and r.json() == {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}
    r = http.post("/props", json={"n_ctx": 5})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    assert "--props" in r.json()["error"]["message"]
    assert http.get("/lora-adapters", params={"model": "chat-a"}).json() == []
    ok = http.post("/lora-adapters", params={"model": "chat-a"}, json=[])
    assert ok.status_code == 200 and ok.json() == {"success": True}
    bad = http.post("/lora-adapters", params={"model": "chat-a"}, json=[{"id": 0, "scale": 1.0}])
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "id"
    assert http.post("/lora-adapters", json={"id": 0}).status_code == 400  # not an array
    assert http.get("/lora-adapters", params={"model": "nope"}).status_code == 404


def test_n_predict_zero_generates_nothing(http: httpx.Client) -> None:
    out = complete(http, prompt="Just fill the cache", n_predict=0)
    assert out["content"] == "" and out["tokens_predicted"] == 0 and out["stop_type"] == "limit"


def test_tokenize_with_pieces(http: httpx.Client) -> None:
    text = "Hello world, 𠜎 and ☃"
    plain = http.post("/tokenize", json={"model": "chat-a", "content": text}).json()["tokens"]
    r = http.post("/tokenize", json={"model": "chat-a", "content": text, "with_pieces": True})
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    assert [t["id"] for t in tokens] == plain
    data = b""
    for t in tokens:
        piece = t["piece"]
        if isinstance(piece, str):
            data += piece.encode()
        else:  # bytes that are not UTF-8 on their own: a list of byte values
            assert all(isinstance(b, int) and 0 <= b < 256 for b in piece)
            data += bytes(piece)
    assert data.decode() == text
    assert any(isinstance(t["piece"], list) for t in tokens)  # 𠜎 is byte-fallback tokens


def test_detokenize_round_trip(http: httpx.Client) -> None:
    text = "Corral speaks llama-server's API too: ünïcødé 🦙"
    ids = http.post("/tokenize", json={"model": "chat-a", "content": text}).json()["tokens"]
    r = http.post("/detokenize", json={"model": "chat-a", "tokens": ids})
    assert r.status_code == 200 and r.json() == {"content": text}


def test_apply_template_renders_the_chat_template(http: httpx.Client) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    r = http.post("/apply-template", json={"model": "chat-a", "messages": messages})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "<start_of_turn>user\n" in prompt and "Hi there" in prompt
    assert prompt.endswith("<start_of_turn>model\n")  # the generation prompt
    # llama.cpp's test_template.py test_add_generation_prompt: without it, no opened turn.
    r = http.post("/apply-template", json={"model": "chat-a", "messages": messages, "add_generation_prompt": False})
    assert r.status_code == 200 and not r.json()["prompt"].endswith("<start_of_turn>model\n")
    assert r.json()["prompt"] == prompt.removesuffix("<start_of_turn>model\n")
    # test_chat_completion.py: continue_final_message with add_generation_prompt true is a 400.
    chat = {"model": "chat-a", "max_tokens": 2, "add_generation_prompt": True, "continue_final_message": True,
            "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    r = http.post("/v1/chat/completions", json=chat)
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
    r = http.post("/v1/chat/completions", json={**chat, "add_generation_prompt": False})
    assert r.status_code == 200, r.text


def test_props_describes_the_model_and_never_its_path(http: httpx.Client) -> None:
    r = http.get("/props", params={"model": "a-alias"})
    assert r.status_code == 200, r.text
    props = r.json()
    assert props["total_slots"] == 4
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 2048 and settings["is_processing"] is False
    assert {"n_predict", "seed", "temperature", "top_k", "top_p", "min_p", "stop"} <= settings["params"].keys()
    assert props["chat_template"] == "gemma"  # a built-in's name; a Jinja template is its text
    # The file's name, as llama-server's test_basic.py test_server_props reads it (".gguf"
    # in it), and none of its folders.
    assert props["model_alias"] == "a-alias" and props["model_path"] == DEMO_MODEL.name
    assert "/" not in props["model_path"]
    assert props["modalities"] == {"vision": False, "audio": False}
    assert props["build_info"]
    assert str(DEMO_MODEL.parent) not in r.text  # the file's name, never its folders


def test_slots_lists_every_slot(http: httpx.Client) -> None:
    r = http.get("/slots", params={"model": "chat-b"})
    assert r.status_code == 200, r.text
    slots = r.json()
    assert [s["id"] for s in slots] == [0, 1]
    for s in slots:
        assert s["n_ctx"] == 1024 and isinstance(s["is_processing"], bool)
        if s["is_processing"]:
            assert {"n_predict", "temperature"} <= s["params"].keys()
            assert {"has_next_token", "n_remain", "n_decoded"} <= s["next_token"].keys()
        else:  # a slot with no task, as llama-server shows one
            assert "params" not in s and "next_token" not in s


# ---- errors, in llama-server's shape ----------------------------------------------------------


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["code"] == status and isinstance(err["message"], str) and err["message"]
    return err


def test_a_prompt_over_the_context_is_exceed_context_size_error_with_its_counts(http: httpx.Client) -> None:
    r = http.post("/completion", json={"model": "chat-b", "prompt": "hello " * 1500, "n_predict": 4})
    err = error_of(r, 400)
    assert err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == 1024 and err["n_prompt_tokens"] > 1024


def test_a_prompt_refused_by_its_length_alone_still_carries_its_counts(http: httpx.Client) -> None:
    r = http.post("/completion", json={"model": "chat-b", "prompt": "x" * 200_000})
    err = error_of(r, 400)
    assert err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == 1024 and err["n_prompt_tokens"] > 1024


@pytest.mark.parametrize("prompt", [[2, 999_999_999], [2, -1], [262144]])
def test_a_bad_token_id_is_a_400_naming_prompt(http: httpx.Client, prompt: list[int]) -> None:
    r = http.post("/completion", json={"model": "chat-a", "prompt": prompt, "n_predict": 2})
    err = error_of(r, 400)
    assert err["type"] == "invalid_request_error" and err["param"] == "prompt"
    # The worker lives on.
    assert complete(http, prompt="still here", n_predict=1)["stop"] is True


def test_detokenize_refuses_a_bad_token_id(http: httpx.Client) -> None:
    err = error_of(http.post("/detokenize", json={"model": "chat-a", "tokens": [5, 262144]}), 400)
    assert err["type"] == "invalid_request_error" and err["param"] == "tokens"


@pytest.mark.parametrize("path", ["/completion", "/tokenize", "/detokenize", "/apply-template"])
def test_bad_json_is_invalid_request_error(http: httpx.Client, path: str) -> None:
    r = http.post(path, content=b'{"model": "chat-a", "prompt": ', headers={"content-type": "application/json"})
    assert error_of(r, 400)["type"] == "invalid_request_error"


def test_model_missing_or_unknown(http: httpx.Client) -> None:
    err = error_of(http.post("/completion", json={"prompt": "hi"}), 400)
    assert err["param"] == "model"
    err = error_of(http.get("/props", params={"model": "nope"}), 404)
    assert err["type"] == "not_found_error"


def test_a_sampler_corral_lacks_is_refused_by_name(http: httpx.Client) -> None:
    err = error_of(http.post("/completion", json={"model": "chat-a", "prompt": "hi", "mirostat": 2}), 400)
    assert err["param"] == "mirostat"
    # ...and accepted at its disabled value, as llama.cpp's clients send it.
    assert complete(http, prompt="hi", n_predict=1, mirostat=0, typical_p=1.0, samplers=["top_k"])["stop"]


# ---- llama-server's extensions on the OpenAI routes ------------------------------------------


def test_v1_n_predict_and_timings_per_token(http: httpx.Client) -> None:
    body = {"model": "chat-a", "messages": [{"role": "user", "content": "Hi"}], "n_predict": 3,
            "timings_per_token": True, "cache_prompt": True, "top_k": 20, "min_p": 0.1, **GREEDY}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["completion_tokens"] <= 3
    assert TIMINGS <= out["timings"].keys()
    r = http.post("/v1/chat/completions", json={**body, "stream": True})
    chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    assert chunks and all(TIMINGS <= c["timings"].keys() for c in chunks[1:])
    assert r.text.rstrip().endswith("data: [DONE]")  # the OpenAI routes keep OpenAI's stream
    plain = http.post("/v1/completions", json={"model": "chat-a", "prompt": "Hi", "n_predict": 2, **GREEDY}).json()
    assert plain["usage"]["completion_tokens"] <= 2 and "timings" not in plain


def test_v1_errors_keep_openais_shape(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"model": "chat-b", "prompt": "hello " * 1500})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
    assert "n_ctx" not in err


def test_random_token_prompts_never_crash_the_worker(server: Server, http: httpx.Client) -> None:
    """Ids anywhere in and around the vocabulary, mixed with text, with random limits:
    every answer is a 200 or a 400, and the worker is the same process afterwards."""
    import random

    rng = random.Random(10)
    n_vocab = 262144
    complete(http, prompt="warm up", n_predict=1)
    pid = server.workers()["chat-a"]
    for i in range(30):
        ids: list[int | str] = [rng.choice([rng.randrange(n_vocab), rng.randrange(-3, 3), n_vocab + rng.randrange(3)])
                                for _ in range(rng.randrange(1, 12))]
        if rng.random() < 0.3:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(["hi", " ünï 🦙", "<start_of_turn>"]))
        body = {"model": "chat-a", "prompt": ids, "n_predict": rng.randrange(-3, 6), "stream": rng.random() < 0.5,
                "temperature": rng.choice([0.0, 0.8, 2.0])}
        r = http.post("/completion", json=body)
        assert r.status_code in (200, 400), (body, r.text)
        if r.status_code == 400:
            assert r.json()["error"]["param"] in ("prompt", "n_predict"), r.text
        only_ids = [t for t in ids if isinstance(t, int)]
        d = http.post("/detokenize", json={"model": "chat-a", "tokens": only_ids})
        assert d.status_code in (200, 400), d.text
    assert server.workers()["chat-a"] == pid
    assert "Traceback" not in server.log_text()
