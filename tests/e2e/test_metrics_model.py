"""The metrics that only a real worker can give: prompt tokens served from the prefix
cache, and the KV cells the slots hold."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Server


def _metric(text: str, name: str, model: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels.get("model") == model:
                return s.value
    return None


def test_a_repeated_prompt_counts_cached_tokens_and_the_slots_hold_kv_cells(server: Server) -> None:
    before = _metric(httpx.get(server.url + "/metrics").text, "corral_prompt_tokens_cached_total", "chat-b") or 0.0
    prompt = "Tell me about the history of the city of Lyon, its bridges, its food and its silk. " * 4
    usages = []
    for _ in range(2):
        r = httpx.post(
            server.base + "/chat/completions",
            json={"model": "chat-b", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4},
            timeout=120,
        )
        assert r.status_code == 200
        usages.append(r.json()["usage"])
    cached = usages[1]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    text = httpx.get(server.url + "/metrics").text
    # Both requests count: the first may find a few of its tokens (the template's head)
    # cached by an earlier test's prompt on the same server.
    served = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert _metric(text, "corral_prompt_tokens_cached_total", "chat-b") == before + served
    # The KV figure comes with the worker's next ping.
    deadline = time.monotonic() + 15
    cells = None
    while time.monotonic() < deadline and not cells:
        time.sleep(0.5)
        cells = _metric(httpx.get(server.url + "/metrics").text, "corral_model_kv_cells_used", "chat-b")
    assert cells is not None and cells >= usages[1]["prompt_tokens"]
    # The same cells as the fraction a scheduler reads (KVCacheUtilization), of the model's
    # n_ctx as /admin/models reports it; nothing waits or runs once both answers are in.
    n_ctx = httpx.get(server.url + "/admin/models/chat-b").json()["model"]["loaded"]["n_ctx"]
    text = httpx.get(server.url + "/metrics").text
    ratio = _metric(text, "corral_model_kv_cache_usage_ratio", "chat-b")
    cells = _metric(text, "corral_model_kv_cells_used", "chat-b")
    assert cells is not None and ratio == min(1.0, cells / n_ctx) and 0 < ratio <= 1
    assert _metric(text, "corral_model_requests_waiting", "chat-b") == 0
    assert _metric(text, "corral_model_requests_running", "chat-b") == 0
