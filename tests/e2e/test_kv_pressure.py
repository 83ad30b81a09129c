"""A KV cache too small for every request at once: the engine must preempt and resume, not
fail. Four requests of ~60 prompt + 80 output tokens each need ~560 cells; the cache has
256 (n_ctx), so requests are preempted and later recompute their tokens. Greedy output must
be exactly what each request produces alone."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import start_server, stop_server

CONFIG = """
[server]
port = {PORT}

[supervisor]
idle_timeout = 0

[models.tight]
path = "{MODEL}"
slots = 4
n_ctx = 256
n_batch = 64
"""


def test_preemption_under_kv_pressure_keeps_results_exact(tmp_path: Path) -> None:
    """Added with 70f2c99: a preempted request re-admitted on the next step only refilled the
    cache and was preempted again; it now waits until some request finishes."""
    srv = start_server(tmp_path, CONFIG)
    try:
        url = srv.url + "/v1/completions"
        # Gemma splits numbers into digits: 15 two-digit numbers are ~60 tokens.
        prompts = [", ".join(str(n) for n in range(start, start + 15)) + "," for start in (10, 30, 50, 70)]

        def run(p: str) -> dict[str, object]:
            r = httpx.post(
                url,
                json={"model": "tight", "prompt": p, "max_tokens": 80, "temperature": 0, "ignore_eos": True},
                timeout=300,
            )
            assert r.status_code == 200, r.text
            return r.json()  # type: ignore[no-any-return]

        alone = [run(p) for p in prompts]
        pid = srv.workers()["tight"]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            together = list(pool.map(run, prompts))

        for a, t in zip(alone, together):
            assert t["choices"][0]["text"] == a["choices"][0]["text"]  # type: ignore[index]
            assert t["usage"]["completion_tokens"] == 80, t["usage"]  # type: ignore[index]
        assert srv.workers() == {"tight": pid}  # no crash, no restart
        assert "preempted request" in srv.log_text()  # the path under test really ran
        # A lone request that needs more than the whole cache ends at its context limit.
        long = run(", ".join(str(n) for n in range(1, 60)) + ",")
        assert long["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
        assert long["usage"]["prompt_tokens"] + long["usage"]["completion_tokens"] <= 256  # type: ignore[index]
    finally:
        assert stop_server(srv) == 0


STOCK_LIKE = """
[server]
port = {PORT}

[supervisor]
idle_timeout = 0
health_interval = 1

[models.gemma]
path = "{MODEL}"
slots = 4
n_ctx = 2048
chat_template = "gemma"
max_tokens = 256
"""


def test_a_full_kv_cache_leaves_later_answers_as_a_fresh_worker_gives_them(tmp_path: Path) -> None:
    """Issue 20, item 1: four ~200-token chats at once, then one prompt close to n_ctx (the
    worker logs llama.cpp's 'failed to find a memory slot'). All five answered 200; from
    then on the same greedy chat answered degenerate text ('.\\n.\\n.' here) until the
    worker was restarted: its next request kept a template prefix whose sliding-window
    cells had been given away."""
    srv = start_server(tmp_path, STOCK_LIKE)
    try:
        url = srv.url + "/v1/chat/completions"

        def chat(text: str, max_tokens: int) -> dict[str, Any]:
            r = httpx.post(
                url,
                json={"model": "gemma", "messages": [{"role": "user", "content": text}],
                      "max_tokens": max_tokens, "temperature": 0},
                timeout=600,
            )
            assert r.status_code == 200, r.text
            return r.json()  # type: ignore[no-any-return]

        def canary() -> str:
            # A chat turn's head, shared with the chats below, and a continuation with a
            # wide margin at every token (tests/e2e/test_kv_mixes.py says why that matters).
            r = httpx.post(
                srv.url + "/v1/completions",
                json={"model": "gemma", "prompt": "<start_of_turn>user\nWrite the alphabet: A B C D E F G",
                      "max_tokens": 16, "temperature": 0, "ignore_eos": True},
                timeout=600,
            )
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]  # type: ignore[no-any-return]

        fresh = canary()
        words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()

        def text(n: int, step: int) -> str:
            return " ".join(words[(i * step) % 10] for i in range(n))

        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            small = [pool.submit(chat, text(200, k + 1), 60) for k in range(4)]
            time.sleep(0.5)  # the long one arrives while they decode
            long = pool.submit(chat, text(1800, 7), 200)
            answers = [f.result() for f in [*small, long]]
        assert answers[-1]["usage"]["total_tokens"] == 2048  # it ran to the pool's limit
        assert answers[-1]["choices"][0]["finish_reason"] == "length"
        assert "failed to find a memory slot" in srv.log_text()  # the cache really filled
        for _ in range(3):  # the slot that lost its cells kept winning the same prompt
            assert canary() == fresh
        time.sleep(2.5)  # a health ping carries the worker's KV counters
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'corral_model_kv_repairs_total{model="gemma"} 0.0' in metrics
        assert 'corral_model_kv_prefixes_refused_total{model="gemma"}' in metrics
    finally:
        assert stop_server(srv) == 0
