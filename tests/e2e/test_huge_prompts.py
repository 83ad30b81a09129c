"""Prompts that cannot fit are refused with a 400 naming the parameter, wherever the
length hides, while a stream on the same model runs on untouched (issue 8, finding 3).

Timings are measured by bench/hostile_prompt.py; this test checks behaviour: each path that
refuses (the router's byte bound, the worker's measured template, the worker's token count)
gives the same answer, and the stream neither fails nor loses tokens.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from tests.e2e.conftest import Server

WORDS = "the quick brown fox jumps over the lazy dog "


def text(n_bytes: int) -> str:
    return (WORDS * (n_bytes // len(WORDS) + 1))[:n_bytes]


def refused(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400, (path, r.status_code, r.text[:300])
    err: dict[str, Any] = r.json()["error"]
    assert err["code"] == "context_length_exceeded", err
    return err


def test_huge_prompts_are_refused_while_a_stream_runs_on(server: Server) -> None:
    warm = httpx.post(server.url + "/v1/completions", json={"model": "chat-a", "prompt": "hi", "max_tokens": 1}, timeout=60)
    assert warm.status_code == 200
    pid = server.workers()["chat-a"]
    finished: dict[str, Any] = {}

    def stream() -> None:
        body = {
            "model": "chat-a", "prompt": "Count: 1, 2, 3,", "max_tokens": 120,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        finished["events"] = events

    runner = threading.Thread(target=stream)
    runner.start()
    try:
        big = text(1_000_000)
        # The router's bound: a completion's prompt, a chat's last user message.
        err = refused(server, "/v1/completions", {"model": "chat-a", "prompt": big})
        assert err["param"] == "prompt" and "at least" in err["message"]
        err = refused(server, "/v1/chat/completions", {"model": "chat-a", "messages": [{"role": "user", "content": text(15_000_000)}]})
        assert err["param"] == "messages"
        # The length hides in earlier turns: the worker measures the rendered chat.
        history = [{"role": r, "content": text(200_000)} for r in ("user", "assistant") * 3]
        err = refused(server, "/v1/chat/completions", {"model": "chat-a", "messages": [*history, {"role": "user", "content": "and?"}]})
        assert err["param"] == "messages" and "at least" in err["message"]
        # Under the byte bound (2047 x 48 bytes), so it is tokenized, then counted.
        err = refused(server, "/v1/completions", {"model": "chat-a", "prompt": text(60_000)})
        assert err["param"] == "prompt" and "at least" not in err["message"]
        # /tokenize and embeddings have their own bounds.
        # /tokenize is llama-server's route: its error shape, with the counts.
        r = httpx.post(server.url + "/tokenize", json={"model": "chat-a", "content": big}, timeout=60)
        err = r.json()["error"]
        assert r.status_code == 400 and err["type"] == "exceed_context_size_error", err
        assert err["param"] == "content" and err["n_prompt_tokens"] > err["n_ctx"] == 2048
        err = refused(server, "/v1/embeddings", {"model": "embed", "input": ["short", big]})
        assert err["param"] == "input" and "input[1]" in err["message"]
    finally:
        runner.join(timeout=120)
    events = finished["events"]
    assert events[-1] == "data: [DONE]"
    assert '"completion_tokens":120' in events[-2]  # every token, none lost
    assert not any('"error"' in e for e in events)
    assert server.workers().get("chat-a") == pid  # the same worker throughout
    assert "Traceback" not in server.log_text()
