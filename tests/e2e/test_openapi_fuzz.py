"""Requests generated from the served OpenAPI document, against the real worker.

schemathesis reads /openapi.json (generated from the request types, router/server/openapi.py) and
draws bodies from it, valid and invalid alike: every answer must be a 2xx, or a 4xx in
its dialect's error JSON (OpenAI's, llama-server's, Ollama's). No 5xx, no request past its
deadline, no worker restart.

Two narrowings keep the draws meaningful; both are made on a copy of the document, which
the server serves unchanged:
- `model` is mostly the one configured model (or left out, for default_model). A random
  string only ever finds the 404, which one draw in five still tries.
- A message is drawn with a role and content most of the time: the document types
  `messages` as free-form objects, and free-form objects almost never have a role.
- `n` is drawn small (or invalid), and `prompt` short: up to 1024 choices of a long prompt
  are valid, and would make a run's length depend on a few draws.
- Ollama's `keep_alive` is drawn from values that keep the model loaded.

`make test` runs CORRAL_API_FUZZ_REQUESTS (default 480; `make test-long` 2,000) spread over the operations that take input;
the acceptance run used 5000 (`--hypothesis-show-statistics` counts the requests sent: the
"passing" cases, one request each; "invalid" ones were never sent).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from router.api import anthropic, llama, ollama, responses
from router.app import DIALECTS
from router.app import openapi_document as document
from tests.e2e.conftest import Server, start_server, stop_server

N_REQUESTS = int(os.environ.get("CORRAL_API_FUZZ_REQUESTS", "480"))
DEADLINE = 300.0  # seconds for one request (a busy 2-core machine); a hang fails the test

# A small context bounds every generation (whatever max_tokens a draw asks for) to well under
# a second, so thousands of draws finish in minutes.
CONFIG = """
[server]
port = {PORT}
default_model = "fuzz"

[supervisor]
idle_timeout = 0

[models.fuzz]
path = "{MODEL}"
slots = 4
n_ctx = 128
n_batch = 128
"""

_MESSAGE = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "role": {"enum": ["system", "user", "assistant", "developer", "tool", "bogus"]},
                "content": {"anyOf": [{"type": "string", "maxLength": 200}, {"type": "array"}, {"type": "null"}]},
            },
            "required": ["role", "content"],
        },
        {"type": "object"},
    ]
}


def fuzz_document() -> dict[str, Any]:
    doc = copy.deepcopy(document())
    for name, schema in doc["components"]["schemas"].items():
        props = schema.get("properties", {})
        if "model" in props:
            props["model"] = {"anyOf": [{"enum": ["fuzz", None]}, {"enum": ["fuzz"]}, {"type": "string"}]}
        if "messages" in props:
            props["messages"] = {"type": "array", "items": _MESSAGE, "maxItems": 6}
        if "n" in props:
            # Up to 1024 choices are valid and each is a generation: draw a few, or an
            # invalid count, so that a run's length stays bounded.
            props["n"] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 3}, {"type": "integer", "maximum": 0},
                                    {"type": "integer", "minimum": 129}]}
        if name == "ModelActionRequest":
            # /models/load and /models/unload: unloading the one worker between draws
            # would count as a restart. Draw names it does not serve (404s); loading and
            # unloading themselves have process tests (tests/process/test_llama_server_peer.py).
            props["model"] = {"type": "string", "pattern": "^zz"}
        if "keep_alive" in props:
            # Ollama's: a short one would unload the one worker between draws, which the
            # fixture counts as a restart. Its parsing has unit tests of its own.
            props["keep_alive"] = {"enum": [None, -1, "10m", "soon"]}
        if "prompt" in props:
            props["prompt"] = {"anyOf": [{"type": "string", "maxLength": 200},
                                         {"type": "array", "maxItems": 3}]}
    return doc


SCHEMA = schemathesis.openapi.from_dict(fuzz_document())
# schemathesis reads at most 20 events of a stream and then hangs up (its default
# max_stream_events), which the server sees as a client gone mid-answer, and the test as a
# stream without its end. Every stream here is bounded by the small context (at most a few
# hundred events per choice), so read each one whole.
SCHEMA.config.max_stream_events = 1_000_000
# schemathesis 4's coverage phase draws every case the schema defines, whatever max_examples
# says: about 700 s of `make test` on two cores, where the drawn requests took about 40.
# `make test` runs the examples and the drawn requests; `make test-long` adds the coverage
# phase (CORRAL_API_FUZZ_COVERAGE=1).
COVERAGE = os.environ.get("CORRAL_API_FUZZ_COVERAGE", "") == "1"
SCHEMA.config.phases.update(phases=["examples", "fuzzing", *(["coverage"] if COVERAGE else [])])
# Spread over the operations that take input: GET /v1/models has none, so hypothesis sends it
# once whatever max_examples says (the 5,040 asked for once came to 4,481 requests sent).
OPERATIONS = [op for d in DIALECTS for op in d.operations]
DRAWN = [op for op in OPERATIONS if op.body is not None or op.path_params]
PER_OPERATION = max(1, -(-N_REQUESTS // len(DRAWN)))
NATIVE = {op.path for op in llama.OPERATIONS}
# llama-server's answer for a feature the model lacks is a 501 (not_supported_error): the
# fuzzed model has no fill-in-the-middle tokens and serves no embeddings.
FEATURE_MISSING = {"/infill", "/embedding"}
OLLAMA = {op.path for op in ollama.OPERATIONS}
ANTHROPIC = {op.path for op in anthropic.OPERATIONS}
RESPONSES = {op.path for op in responses.OPERATIONS}


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("apifuzz"), CONFIG)
    # Load the model first, so that the worker pid can be checked for restarts.
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=60)
    assert r.status_code == 200, r.text
    pid = srv.workers()["fuzz"]
    yield srv
    # The one worker served everything and still answers.
    assert srv.workers() == {"fuzz": pid}
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
    assert "Traceback" not in srv.log_text()
    assert stop_server(srv) == 0


@SCHEMA.parametrize()
@settings(
    max_examples=PER_OPERATION,
    deadline=None,
    derandomize=True,  # the same draws every run, so a failure reproduces
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_generated_requests_get_2xx_or_an_openai_4xx(case: schemathesis.Case, api_server: Server) -> None:
    response = case.call(base_url=api_server.url, timeout=DEADLINE)
    assert not response.stream_cut_short, "schemathesis stopped reading the stream: the check below would be void"
    status = response.status_code
    text = response.text
    # The start and the end of the answer: a stream's end is where a cut shows.
    shown = repr(text) if len(text) <= 1500 else f"{text[:500]!r} ... {text[-1000:]!r}"
    seen = f"{case.method} {case.path} -> {status} {response.headers}: {shown}\nbody: {case.body!r}"
    if status == 501 and case.path in FEATURE_MISSING:
        err = json.loads(response.text)["error"]
        assert err["code"] == 501 and err["type"] == "not_supported_error", seen
        return
    assert status < 500, seen[:3000]
    if status >= 400:
        assert status < 500
        body = json.loads(response.text)
        err = body["error"]
        if case.path in OLLAMA:  # Ollama's shape: the message alone
            assert isinstance(err, str) and err, seen
            return
        if case.path in ANTHROPIC:  # Anthropic's: {"type": "error", "error": {"type", "message"}}
            assert body["type"] == "error" and set(err) == {"type", "message"} and err["message"], seen
            assert err["type"] in ("invalid_request_error", "not_found_error", "request_too_large"), seen
            return
        assert isinstance(err["message"], str) and err["message"], seen
        if case.path in NATIVE:  # llama-server's shape: the status as `code`
            assert err["code"] == status and {"message", "type", "code"} <= set(err), seen
        else:
            assert set(err) == {"message", "type", "param", "code"}, seen
            assert err["type"] == "invalid_request_error", seen
    elif case.method == "OPTIONS":  # schemathesis probes undocumented methods too
        assert response.headers.get("allow"), seen
    else:
        assert 200 <= status < 300
        content_type = response.headers.get("content-type") or [""]  # values are lists here
        if content_type[0].startswith("text/event-stream"):
            events = [line for line in response.text.split("\n") if line.startswith("data: ")]
            # A stream ends with [DONE], or with an error event (never a cut stream).
            # A stream ends with [DONE] (/completion: with its final `stop: true` event), or
            # with an error event; never cut.
            last = events[-1] if events else ""
            if case.path in ANTHROPIC:  # message_stop, or an error event
                done = '"type":"message_stop"' in last or '"type":"error"' in last
            elif case.path in RESPONSES:  # the response's end, whichever it was
                done = any(f'"type":"response.{end}"' in last for end in ("completed", "incomplete", "failed"))
            else:
                done = last == "data: [DONE]" or '"error"' in last or (case.path in NATIVE and '"stop":true' in last)
            assert done, seen[:4000]
        elif content_type[0].startswith("application/x-ndjson"):
            # Ollama's: one object a line, the last `done: true` or an error.
            lines = [json.loads(line) for line in response.text.splitlines()]
            assert lines and (lines[-1].get("done") is True or "error" in lines[-1]), seen[:4000]
        else:
            assert response.text, seen[:3000]
            json.loads(response.text)


def test_the_served_document_is_the_generated_one(api_server: Server) -> None:
    r = httpx.get(api_server.url + "/openapi.json", timeout=10)
    assert r.status_code == 200
    assert r.json() == json.loads(json.dumps(document()))
