"""n > 1, logprobs, logit_bias and the prompt/input variants with the real worker, through
the openai client validating every response against its models (issue 10, item 4)."""

from __future__ import annotations

import json
import math
import secrets
import time
from typing import Iterator

import httpx
import openai
import pytest

from tests.e2e.conftest import Server, pooled_briefly, start_server, stop_server

# Pings every 0.2 s, so the worker's prompt_tokens_decoded reaches /admin/models quickly.
CONFIG = """
[server]
port = {PORT}

[supervisor]
idle_timeout = 0
health_interval = 0.2

[models.chat]
path = "{MODEL}"
slots = 4
n_ctx = 2048
chat_template = "gemma"

# llama-server's --temp 1.0 --seed 42 --n-predict 10 --top-k 20, as a model's defaults.
[models.seeded]
path = "{MODEL}"
slots = 2
n_ctx = 1024
chat_template = "gemma"
temperature = 1.0
seed = 42
n_predict = 10
top_k = 20

[models.embed]
path = "{MODEL}"
embeddings = true
slots = 2
n_ctx = 1024
"""

GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("sampling"), CONFIG)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, http_client=pooled_briefly(), _strict_response_validation=True)


def tokenize(server: Server, text: str, model: str = "chat", add_special: bool = False) -> list[int]:
    r = httpx.post(server.url + "/tokenize", json={"model": model, "content": text, "add_special": add_special})
    assert r.status_code == 200, r.text
    tokens: list[int] = r.json()["tokens"]
    return tokens


def decoded_so_far(server: Server) -> int:
    """The worker's prompt tokens decoded, once two pings in a row agree (no request of
    this test module is running when it is called, so the figure is settled)."""
    last = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        value = httpx.get(server.url + "/admin/models/chat").json()["model"]["prompt_tokens_decoded"]
        if value is not None and value == last:
            return int(value)
        last = value
        time.sleep(0.5)
    pytest.fail("prompt_tokens_decoded did not settle")


# ---- n > 1 --------------------------------------------------------------------------------------


def test_n_choices_share_one_evaluation_of_the_prompt(server: Server, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    before = decoded_so_far(server)
    # A prompt no cache holds: every one of its tokens but the template's start is new.
    words = " ".join(secrets.token_hex(3) for _ in range(40))
    r = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": f"Repeat these: {words}"}],
        n=3,
        max_tokens=8,
        temperature=1.0,
        seed=7,
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content is not None and c.finish_reason in ("stop", "length") for c in r.choices)
    assert r.usage is not None and r.usage.prompt_tokens > 100
    cached = r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0
    decoded = decoded_so_far(server) - before
    # Evaluated once: exactly the tokens the first choice did not find cached, not 3 times.
    assert decoded == r.usage.prompt_tokens - (cached or 0)
    assert r.usage.completion_tokens <= 3 * 8


def test_n_choices_stream_with_their_indexes(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Say something."}], n=2, max_tokens=6,
        temperature=1.0, seed=3, stream=True,
    )
    text = {0: "", 1: ""}
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1}
    assert text[0] and text[1]


def test_a_models_generation_defaults_apply_and_a_request_wins(server: Server, client: openai.OpenAI) -> None:
    """Issue 22, item 1: a model's temperature, seed and n_predict from its config are what
    a request that sets none gets; streamed or not, the same seed gives the same text
    (llama-server's test_completion.py test_consistent_result_same_seed, with --seed as
    the server's default); the request's own values win."""
    ask = [{"role": "user", "content": "Write a word."}]
    client.chat.completions.create(model="seeded", messages=ask)  # the prompt is cached from here on
    plain = client.chat.completions.create(model="seeded", messages=ask)
    assert plain.usage is not None and plain.usage.completion_tokens <= 10
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(model="seeded", messages=ask, stream=True)
        if c.choices
    )
    explicit = client.chat.completions.create(model="seeded", messages=ask, temperature=1.0, seed=42, max_tokens=10)
    assert plain.choices[0].message.content == streamed == explicit.choices[0].message.content
    longer = client.chat.completions.create(model="seeded", messages=ask, max_tokens=12, **GREEDY)
    assert longer.usage is not None and longer.usage.completion_tokens <= 12
    props = httpx.get(server.url + "/props", params={"model": "seeded"}).json()["default_generation_settings"]
    params = props.get("params", props)
    assert (params["temperature"], params["seed"], params["n_predict"], params["top_k"]) == (1.0, 42, 10, 20)


# ---- logprobs -----------------------------------------------------------------------------------


def test_chat_logprobs_spell_the_content(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Name three fruits."}], max_tokens=16,
        logprobs=True, top_logprobs=5, **GREEDY,
    )
    choice = r.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    content = choice.logprobs.content
    assert b"".join(bytes(t.bytes or []) for t in content).decode() == choice.message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 5
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # Greedy takes the most likely token: it heads its own alternatives.
        assert t.top_logprobs[0].token == t.token and math.isclose(t.top_logprobs[0].logprob, t.logprob)
        assert bytes(t.bytes or []).decode("utf-8", errors="replace") == t.token
    assert sum(math.exp(x.logprob) for x in content[0].top_logprobs) <= 1.0 + 1e-6


def test_streamed_logprobs_cover_exactly_the_streamed_text_even_with_a_stop_string(client: openai.OpenAI) -> None:
    kw = dict(model="chat", messages=[{"role": "user", "content": "Describe the sea in one sentence."}],
              max_tokens=20, logprobs=True, top_logprobs=1, **GREEDY)
    whole = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    tokens = whole.choices[0].logprobs.content
    answer = whole.choices[0].message.content
    # Stop at the fourth token's text where it first occurs: what precedes it is content.
    stop = tokens[3].token
    cut = answer.index(stop)
    stream = client.chat.completions.create(**kw, stop=[stop], stream=True)  # type: ignore[call-overload]
    text, pieces = "", b""
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            for t in (c.logprobs.content or []) if c.logprobs else []:
                pieces += bytes(t.bytes or [])
    assert text == answer[:cut]
    # A stop string's tokens are not content: the logprobs end where the text does.
    boundaries = {0}
    for t in tokens:
        boundaries.add(max(boundaries) + len(t.token))
    if cut in boundaries:
        assert pieces.decode() == text
    else:
        assert text.startswith(pieces.decode())


def test_completion_logprobs_in_the_legacy_shape(client: openai.OpenAI) -> None:
    r = client.completions.create(model="chat", prompt="The capital of France is", max_tokens=8, logprobs=3, **GREEDY)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset[0] == 0
    assert all(1 <= len(alts) <= 3 for alts in lp.top_logprobs)
    offsets = [0]
    for t in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(t))
    assert lp.text_offset == offsets


# ---- logit_bias ---------------------------------------------------------------------------------


def test_logit_bias_minus_100_on_the_greedy_token_changes_the_answer(server: Server, client: openai.OpenAI) -> None:
    kw = dict(model="chat", prompt="The capital of France is", max_tokens=6, logprobs=0, **GREEDY)
    plain = client.completions.create(**kw)  # type: ignore[call-overload]
    first = plain.choices[0].logprobs.tokens[0]
    ids = tokenize(server, first)
    assert len(ids) == 1, f"{first!r} is one token"
    biased = client.completions.create(**kw, logit_bias={str(ids[0]): -100})  # type: ignore[call-overload]
    assert biased.choices[0].logprobs.tokens[0] != first
    assert biased.choices[0].text != plain.choices[0].text
    # Logprobs come from the biased logits: the banned token is not among the likely ones.
    again = client.completions.create(**{**kw, "logprobs": 5}, logit_bias={str(ids[0]): -100})  # type: ignore[call-overload]
    assert first not in again.choices[0].logprobs.top_logprobs[0]


@pytest.mark.parametrize("form", ["object", "pairs", "ban"])
def test_logit_bias_by_text_and_as_pairs_keeps_the_words_out(server: Server, form: str) -> None:
    """llama.cpp's test_completion.py test_logit_bias (tokenize=False and openai_style
    both ways): a text key biases its tokens; [[text, bias]] and `false` as llama-server
    takes them (server-schema.cpp)."""
    kw = {"model": "chat", "prompt": "The capital of France is", "max_tokens": 8, **GREEDY}
    plain = httpx.post(server.base + "/completions", json=kw).json()["choices"][0]["text"]
    word = plain.split()[0]
    bias: object = {
        "object": {" " + word: -100, word: -100},
        "pairs": [[" " + word, -100], [word, -100]],
        "ban": [[" " + word, False], [word, False]],
    }[form]
    r = httpx.post(server.base + "/completions", json={**kw, "logit_bias": bias})
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert text.split()[:1] != [word], (plain, text)


def test_bad_logit_bias_and_logprobs_are_400s_naming_the_parameter(server: Server) -> None:
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [
        ({**chat, "logit_bias": {"999999": 1}}, "logit_bias"),  # past the vocabulary: the worker says so
        ({**chat, "logit_bias": {"12": 101}}, "logit_bias"),
        ({**chat, "logit_bias": {"x": True}}, "logit_bias"),
        ({**chat, "logit_bias": [[12]]}, "logit_bias"),
        ({**chat, "top_logprobs": 2}, "top_logprobs"),
        ({**chat, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({**chat, "n": 0}, "n"),
    ]
    for body, param in cases:
        r = httpx.post(server.base + "/chat/completions", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param
    r = httpx.post(server.base + "/completions", json={"model": "chat", "prompt": [1, 300000], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


# ---- prompt variants ----------------------------------------------------------------------------


def test_a_token_array_prompt_answers_as_its_text(server: Server, client: openai.OpenAI) -> None:
    # Counting, whose greedy tokens win by wide margins: "Once upon a time" tipped between
    # "John" and "Lily" with the cells in other places (a fresh-clone run, issue 24).
    text = "Counting: 1, 2, 3, 4,"
    tokens = tokenize(server, text, add_special=True)  # the BOS a text prompt gets too
    by_text = client.completions.create(model="chat", prompt=text, max_tokens=8, **GREEDY)
    by_tokens = client.completions.create(model="chat", prompt=tokens, max_tokens=8, **GREEDY)
    assert by_tokens.choices[0].text == by_text.choices[0].text
    assert by_tokens.usage is not None and by_tokens.usage.prompt_tokens == len(tokens)


def test_a_list_of_prompts_gives_n_choices_each_in_openai_order(server: Server, client: openai.OpenAI) -> None:
    prompts = ["Once upon a time", "The capital of France is"]
    singles = [client.completions.create(model="chat", prompt=p, max_tokens=6, **GREEDY).choices[0].text for p in prompts]
    r = client.completions.create(model="chat", prompt=prompts, n=2, max_tokens=6, **GREEDY)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    texts = [c.text for c in r.choices]
    # Only the start is compared. Greedy siblings share their prompt's logits (so their
    # first token is the same) but later rows of one batch, and attention over shared
    # cells, sum in other orders than a request alone: this small model's near ties can
    # tip a later token (measured: "a small town" against "a little girl" at token 5).
    first_words = [t.split()[0] for t in singles]
    assert [t.split()[0] for t in texts] == [first_words[0], first_words[0], first_words[1], first_words[1]]
    tokens = [tokenize(server, p, add_special=True) for p in prompts]
    r2 = client.completions.create(model="chat", prompt=tokens, max_tokens=6, **GREEDY)
    assert [c.text.split()[0] for c in r2.choices] == first_words


def test_echo_prepends_the_prompt(server: Server, client: openai.OpenAI) -> None:
    r = client.completions.create(model="chat", prompt="Hello there", echo=True, max_tokens=4, **GREEDY)
    plain = client.completions.create(model="chat", prompt="Hello there", max_tokens=4, **GREEDY)
    assert r.choices[0].text == "Hello there" + plain.choices[0].text
    tokens = tokenize(server, "Hello there", add_special=True)
    r = client.completions.create(model="chat", prompt=tokens, echo=True, max_tokens=4, **GREEDY)
    assert r.choices[0].text == "Hello there" + plain.choices[0].text  # BOS has no text
    # Streamed, with plain HTTP: openai-python's Completion type has no null finish_reason,
    # which every streamed chunk but the last carries (OpenAI's own streams too).
    body = {"model": "chat", "prompt": "Hello there", "echo": True, "max_tokens": 4, "stream": True, **GREEDY}
    with httpx.stream("POST", server.base + "/completions", json=body) as resp:
        lines = [ln[6:] for ln in resp.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    streamed = "".join(c["text"] for ln in lines for c in json.loads(ln)["choices"])
    assert streamed == "Hello there" + plain.choices[0].text


def test_embeddings_take_token_arrays(server: Server, client: openai.OpenAI) -> None:
    texts = ["hello world", "a llama in a field"]
    tokens = [tokenize(server, t, model="embed", add_special=True) for t in texts]
    # float: openai-python validates a base64 answer as if it were a list before decoding it.
    by_text = client.embeddings.create(model="embed", input=texts, encoding_format="float")
    by_tokens = client.embeddings.create(model="embed", input=tokens, encoding_format="float")
    assert len(by_tokens.data) == 2
    for a, b in zip(by_text.data, by_tokens.data):
        assert sum(x * y for x, y in zip(a.embedding, b.embedding)) > 0.9999
    one = client.embeddings.create(model="embed", input=tokens[0], encoding_format="float")
    assert len(one.data) == 1
    r = httpx.post(server.base + "/embeddings", json={"model": "embed", "input": [[1, 999999]]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


def test_llama_servers_mixed_inputs_embed_as_their_text(server: Server) -> None:
    """llama.cpp's test_embedding.py test_embedding_mixed_input and
    test_embedding_content_text_same_as_string: ids and texts mixed, objects, content
    parts; each embeds as the text it spells."""
    head = tokenize(server, "hello", model="embed", add_special=True)  # BOS, hello
    tail = tokenize(server, " world", model="embed")
    inputs = [
        "hello world",
        [*head, " world"],  # ids then a text
        {"prompt_string": "hello world"},
        {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
        ["hello", *tail],  # a text first (it gets the BOS), then ids
    ]
    r = httpx.post(server.base + "/embeddings", json={"model": "embed", "input": inputs})
    assert r.status_code == 200, r.text
    vectors = [d["embedding"] for d in r.json()["data"]]
    assert len(vectors) == 5
    for v in vectors[1:]:
        assert sum(x * y for x, y in zip(vectors[0], v)) > 0.999
    single = httpx.post(server.base + "/embeddings", json={"model": "embed", "input": [*head, " world"]})
    assert single.status_code == 200 and len(single.json()["data"]) == 1


def test_a_mixed_prompt_completes_as_its_text(server: Server, client: openai.OpenAI) -> None:
    """llama.cpp's test_completion.py mixed prompts, on /v1/completions: one prompt of ids
    and strings, and a list mixing such a prompt with a string."""
    head = tokenize(server, "Once upon", add_special=True)
    by_text = client.completions.create(model="chat", prompt="Once upon a time", max_tokens=6, **GREEDY)
    r = httpx.post(server.base + "/completions", json={
        "model": "chat", "prompt": [*head, " a time"], "max_tokens": 6, **GREEDY,
    })
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].split()[:1] == by_text.choices[0].text.split()[:1]
    r = httpx.post(server.base + "/completions", json={
        "model": "chat", "prompt": ["Once upon a time", [*head, " a time"]], "max_tokens": 6, **GREEDY,
    })
    assert r.status_code == 200 and len(r.json()["choices"]) == 2


def test_the_server_is_still_healthy(server: Server) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    assert server.process.poll() is None
    log = server.log_text()
    assert "Traceback" not in log, log[-3000:]


