"""A KV cache too small for every request at once: the engine must preempt and resume, not
fail. Four requests of ~60 prompt + 80 output tokens each need ~560 cells; the cache has
256 (n_ctx), so requests are preempted and later recompute their tokens. Greedy output must
be exactly what each request produces alone."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

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
