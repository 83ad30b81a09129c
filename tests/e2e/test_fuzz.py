"""Random requests against the real worker: no crash, no hang, no 5xx.

Each request draws random sampling parameters, random stop strings (unicode and emoji
included), a random prompt length up to and past the slot limit, and sometimes a
cancellation: a stream closed after a few chunks, or a non-streaming request whose client
gives up. It also draws what issue 10 added: n choices, logprobs, logit_bias, a JSON
schema or json_object, and tools with every tool_choice. `make test` runs CORRAL_FUZZ_REQUESTS (default 30); `make test-long`, like the acceptance run, 1000.

Expected outcomes: 200, or 400 with a named parameter for prompts past the context.
Anything else, a request past its deadline, or a worker that restarted, fails the test.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.e2e.conftest import Server, start_server, stop_server

N_REQUESTS = int(os.environ.get("CORRAL_FUZZ_REQUESTS", "30"))
N_CTX = 1024
CONCURRENCY = 8
DEADLINE = 180.0  # seconds for any single request; a hang shows up as a timeout

CONFIG = f"""
[server]
port = {{PORT}}

[supervisor]
idle_timeout = 0

[models.fuzz]
path = "{{MODEL}}"
slots = 4
n_ctx = {N_CTX}
n_batch = 256
chat_template = "gemma"
tool_format = "generic"
"""

WORDS = (
    "the a cat dog runs quickly über naïve 東京 中文 🙂 🚀 \n , . ! ? 123 x y z hello world "
    "function return { } ( ) <b> & ' \" \\ \t tokens stop start_of_turn end"
).split(" ")
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "tags": {"type": "array", "items": {"type": "integer"}}},
    "required": ["name", "tags"],
}
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a word up.", "parameters": SCHEMA}}
STOP_PIECES = ["\n", ".", " the", "🙂", "ü", "a", "e ", ",", "!!", "東", "xyz", "\n\n", " "]


@dataclass
class Outcome:
    status: int
    body: str
    cancelled: bool
    kind: str


def random_request(rng: random.Random) -> tuple[str, dict[str, object], str]:
    """(path, body, cancel mode) for one random request."""
    # Prompt lengths spread up to ~1.3x the context (1-2 tokens per word), so some must
    # be rejected with context_length_exceeded and many sit near the limit.
    n_words = int(rng.choice([rng.randint(1, 40), rng.randint(1, 700), rng.randint(500, 1300)]))
    text = " ".join(rng.choice(WORDS) for _ in range(n_words))
    body: dict[str, object] = {
        "model": "fuzz",
        "temperature": rng.choice([0.0, rng.uniform(0.0, 2.0)]),
        "top_p": rng.uniform(0.0, 1.0),
        "top_k": rng.choice([0, rng.randint(1, 200)]),
        "min_p": rng.choice([0.0, rng.uniform(0.0, 0.5)]),
        "presence_penalty": rng.uniform(-2.0, 2.0),
        "frequency_penalty": rng.uniform(-2.0, 2.0),
        "repeat_penalty": rng.choice([1.0, rng.uniform(0.5, 2.0)]),
        "repeat_last_n": rng.choice([-1, 0, 64, rng.randint(1, 512)]),
        "max_tokens": rng.choice([rng.randint(1, 48), rng.randint(1, 8)]),
        "stream": rng.random() < 0.5,
    }
    if rng.random() < 0.5:
        body["seed"] = rng.randint(0, 2**63 - 1)
    if rng.random() < 0.6:
        body["stop"] = [
            "".join(rng.choice(STOP_PIECES) for _ in range(rng.randint(1, 3)))
            for _ in range(rng.randint(1, 4))
        ]
    if rng.random() < 0.1:
        body["ignore_eos"] = True
    if rng.random() < 0.5:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": text}]
        if rng.random() < 0.3:
            body["messages"] = [
                {"role": "system", "content": rng.choice(WORDS)},
                {"role": "user", "content": [{"type": "text", "text": text}]},
            ]
    else:
        path = "/v1/completions"
        body["prompt"] = text
    # Issue 10, item 4: choices that share a prompt (and its KV cells, under preemption),
    # biases, logprobs. Drawn from their own generator, so the draws above stay as they were.
    extra = random.Random(rng.random())
    if extra.random() < 0.3:
        body["n"] = extra.randint(2, 5)
    if extra.random() < 0.2:
        body["logit_bias"] = {str(extra.randrange(262144)): extra.uniform(-100, 100) for _ in range(extra.randint(1, 5))}
    if extra.random() < 0.3:
        if path == "/v1/chat/completions":
            body["logprobs"] = True
            body["top_logprobs"] = extra.randint(0, 20)
        else:
            body["logprobs"] = extra.randint(0, 5)
    # Structured output and tools: constrained sampling, with every tool_choice.
    shape = extra.random()
    if path == "/v1/chat/completions" and shape < 0.1:
        body["response_format"] = {"type": "json_object"}
    elif path == "/v1/chat/completions" and shape < 0.2:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
    elif path == "/v1/chat/completions" and shape < 0.35:
        body["tools"] = [TOOL]
        body["tool_choice"] = extra.choice(["auto", "none", "required", {"type": "function", "function": {"name": "lookup"}}])
    elif shape < 0.4:
        body["json_schema"] = SCHEMA
    cancel = rng.choices(["none", "early", "timeout"], weights=[75, 15, 10])[0]
    return path, body, cancel


def send(server: Server, path: str, body: dict[str, object], cancel: str, rng: random.Random) -> Outcome:
    timeout = httpx.Timeout(DEADLINE)
    if cancel == "timeout":
        # The client gives up mid-request; the server must cancel and carry on.
        timeout = httpx.Timeout(DEADLINE, read=rng.uniform(0.05, 1.0))
    try:
        with httpx.Client(timeout=timeout) as client:
            if body.get("stream"):
                with client.stream("POST", server.url + path, json=body) as r:
                    if r.status_code != 200:
                        return Outcome(r.status_code, r.read().decode(), False, "stream")
                    chunks = 0
                    lines = []
                    for line in r.iter_lines():
                        if line:
                            lines.append(line)
                            chunks += 1
                        if cancel == "early" and chunks >= rng.randint(1, 4):
                            return Outcome(200, "", True, "stream")
                    return Outcome(200, "\n".join(lines), False, "stream")
            r = client.post(server.url + path, json=body)
            return Outcome(r.status_code, r.text, False, "whole")
    except httpx.ReadTimeout:
        if cancel == "timeout":
            return Outcome(200, "", True, "timeout")
        raise


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("fuzz"), CONFIG)
    yield srv
    assert stop_server(srv) == 0


def check(outcome: Outcome, body: dict[str, object]) -> None:
    if outcome.cancelled:
        return
    assert outcome.status in (200, 400), f"{outcome.status}: {outcome.body[:500]}"
    if outcome.status == 400:
        err = json.loads(outcome.body)["error"]
        assert err["code"] == "context_length_exceeded", err
        assert err["param"] in ("prompt", "messages")
        return
    n = int(body.get("n", 1))  # type: ignore[call-overload]
    reasons = ("stop", "length", "tool_calls")
    if outcome.kind == "stream":
        events = outcome.body.split("\n")
        assert events[-1] == "data: [DONE]", events[-3:]
        chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
        finished = {c["index"]: c["finish_reason"] for ch in chunks for c in ch["choices"] if c["finish_reason"]}
        assert sorted(finished) == list(range(n)) and set(finished.values()) <= set(reasons), finished
    else:
        doc = json.loads(outcome.body)
        assert [c["index"] for c in doc["choices"]] == list(range(n))
        assert doc["usage"]["completion_tokens"] <= n * int(body["max_tokens"])  # type: ignore[call-overload]
        for choice in doc["choices"]:
            assert choice["finish_reason"] in reasons
            if "message" in choice and choice["message"].get("tool_calls"):
                assert choice["finish_reason"] == "tool_calls"
                for call in choice["message"]["tool_calls"]:
                    assert call["function"]["name"] == "lookup"
                    json.loads(call["function"]["arguments"])  # constrained: always JSON
                continue
            text = (choice["message"]["content"] or "") if "message" in choice else choice["text"]
            for stop in body.get("stop", []):  # type: ignore[union-attr]
                assert stop not in text
            constrained = "response_format" in body or "json_schema" in body
            if constrained and choice["finish_reason"] == "stop" and not body.get("stop"):
                assert isinstance(json.loads(text), dict), text  # whole JSON when not cut
            if "logprobs" in body and "message" in choice:
                content = choice["logprobs"]["content"]
                # The logprobs cover the text's tokens, and no token past it.
                assert text.startswith(b"".join(bytes(t["bytes"]) for t in content).decode(errors="replace"))


def test_random_requests_never_crash_or_hang(fuzz_server: Server) -> None:
    """Found two bugs when it was written (a9744b2): a llama_sampler_init_penalties call that
    did not match the vendored signature (n_vocab first), and its TypeError escaping
    admission, which ran outside the engine loop's try and so killed the worker. Hence the
    check that one worker pid served everything."""
    rng = random.Random(int(os.environ.get("CORRAL_FUZZ_SEED", "20261122")))
    jobs = [random_request(rng) for _ in range(N_REQUESTS)]
    seeds = [rng.random() for _ in jobs]

    # Load the model first, so the worker pid can be checked for restarts.
    httpx.post(fuzz_server.url + "/v1/completions", json={"model": "fuzz", "prompt": "hi", "max_tokens": 1}, timeout=60)
    pid = fuzz_server.workers()["fuzz"]

    def run(i: int) -> tuple[int, Outcome]:
        path, body, cancel = jobs[i]
        return i, send(fuzz_server, path, body, cancel, random.Random(seeds[i]))

    counts = {"ok": 0, "rejected": 0, "cancelled": 0}
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        for i, outcome in pool.map(run, range(len(jobs))):
            check(outcome, jobs[i][1])
            key = "cancelled" if outcome.cancelled else "ok" if outcome.status == 200 else "rejected"
            counts[key] += 1

    # The same worker served everything, and it still answers.
    assert fuzz_server.workers() == {"fuzz": pid}
    r = httpx.post(fuzz_server.url + "/v1/completions", json={"model": "fuzz", "prompt": "hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
    assert "Traceback" not in fuzz_server.log_text()
    # The mix really exercised every path.
    assert counts["ok"] > N_REQUESTS // 2 and counts["rejected"] > 0 and counts["cancelled"] > 0, counts
    print(f"fuzz: {counts}")
    Path(os.environ.get("CORRAL_FUZZ_REPORT", os.devnull)).write_text(json.dumps(counts))
