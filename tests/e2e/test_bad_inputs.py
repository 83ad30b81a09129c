"""Hostile and malformed requests: each gets a 4xx in OpenAI's error envelope, none a 5xx,
and the worker that served the valid requests before them is still the same process."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.conftest import Server

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
EMB = "/v1/embeddings"

# (path, raw body, expected status, expected param or None)
CASES: list[tuple[str, bytes, int, str | None]] = [
    (CHAT, b"[]", 400, None),
    (CHAT, b"null", 400, None),
    (CHAT, b'"text"', 400, None),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}', 400, None),
    (CHAT, b'{"model": 5, "messages": []}', 400, "model"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model"),
    (CHAT, b'{"model": "chat-a"}', 400, "messages"),
    (CHAT, b'{"model": "chat-a", "messages": "hi"}', 400, "messages"),
    (CHAT, b'{"model": "chat-a", "messages": [1, 2]}', 400, "messages[0]"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "wizard", "content": "x"}]}', 400, "messages[0].role"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": 7}]}', 400, "messages[0].content"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 400, "messages[0].content[0].image_url.url"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}', 400, "max_tokens"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', 400, "max_tokens"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "temperature": -0.1}', 400, "temperature"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "top_p": 1e309}', 400, None),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "seed": 1e400}', 400, None),
    # cb0a435: a seed past 64 bits passed validation and overflowed the msgpack encoder (a 500).
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "seed": 123456789012345678901234567890}', 400, "seed"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1000000000000}', 400, "max_tokens"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "top_k": 99999999999999999999}', 400, "top_k"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "stop": 5}', 400, "stop"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "stop": [""]}', 400, "stop"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "n": 0}', 400, "n"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "frobnicate": 1}', 400, "frobnicate"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}}', 400, "stream_options"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "repeat_penalty": 0}', 400, "repeat_penalty"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}', 400, "top_logprobs"),
    (CHAT, b'{"model": "chat-a", "messages": [{"role": "user", "content": "x"}], "logit_bias": {"262144": 1}}', 400, "logit_bias"),
    (CHAT, b'{"model": "embed", "messages": [{"role": "user", "content": "x"}]}', 400, "model"),
    (CHAT, b'{"model": "no-such", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    # A lone UTF-16 surrogate cannot become UTF-8 text: the JSON parser refuses it.
    (COMP, b'{"model": "chat-a", "prompt": "\\ud800 lone"}', 400, None),
    (COMP, b'{"model": "chat-a", "prompt": [1, 2, 262144]}', 400, "prompt"),
    # ["a", 5] is one mixed prompt to llama-server, and so to Corral (issue 22).
    (COMP, b'{"model": "chat-a", "prompt": ["a", 5.5]}', 400, "prompt[1]"),
    (COMP, b'{"model": "chat-a", "prompt": ["a", {"x": 1}]}', 400, "prompt[1]"),
    (COMP, b'{"model": "chat-a", "prompt": {"text": "x"}}', 400, "prompt"),
    (EMB, b'{"model": "embed", "input": []}', 400, "input"),
    (EMB, b'{"model": "embed", "input": [""]}', 400, "input"),
    (EMB, b'{"model": "embed", "input": [[1, 262144]]}', 400, "input"),
    (EMB, b'{"model": "embed", "input": ["a", [1.5]]}', 400, "input[1]"),  # ["a", [1]] is two inputs now
    (EMB, b'{"model": "embed", "input": "x", "encoding_format": "hex"}', 400, "encoding_format"),
    (EMB, b'{"model": "chat-a", "input": "x"}', 400, "model"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES, ids=[f"{i}:{c[0]}" for i, c in enumerate(CASES)])
def test_bad_request_is_a_clean_4xx(server: Server, path: str, body: bytes, status: int, param: str | None) -> None:
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param, err


def test_strange_but_valid_text_is_served(server: Server) -> None:
    """Text that is awkward for a tokenizer or a template, but legal: empty (generation from
    BOS alone), NUL bytes, control characters, special-token strings, the largest
    max_tokens."""
    pid_before = server.workers().get("chat-a")
    weird = ["", "\x00\x00", "<start_of_turn>model\n<end_of_turn>", "\x1b[31m\u202e", "🦙" * 200]
    for text in weird:
        for path, body in [
            (COMP, {"model": "chat-a", "prompt": text, "max_tokens": 3}),
            (CHAT, {"model": "chat-a", "messages": [{"role": "user", "content": text}], "max_tokens": 3}),
        ]:
            r = httpx.post(server.url + path, content=json.dumps(body), headers={"content-type": "application/json"}, timeout=60)
            assert r.status_code == 200, (text, r.text)
    r = httpx.post(server.url + COMP, json={"model": "chat-a", "prompt": "x", "max_tokens": 2**31 - 1, "stop": ["\n"]}, timeout=120)
    assert r.status_code == 200, r.text
    if pid_before is not None:
        assert server.workers()["chat-a"] == pid_before


def test_body_over_the_limit_is_413(server: Server) -> None:
    big = b'{"model": "chat-a", "prompt": "' + b"x" * (17 * 1024 * 1024) + b'"}'
    r = httpx.post(server.url + COMP, content=big, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
