"""After a scripted load of N requests, /metrics counts exactly N of everything, and parses
with prometheus-client's own parser (the real server on a socket, fake workers)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from router.server.metrics import MODEL_SERVER_GAUGES
from supervisor.supervisor import Supervisor
from tests.harness import make_config
from tests.process.support import WORKER_COMMAND, serving_http

N = 24


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_n_requests_count_n_times_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "400")
    sup = Supervisor(make_config(tmp_path, {"a": {"slots": 2}, "e": {"embeddings": True}}), worker_command=WORKER_COMMAND)
    usages: list[dict[str, int]] = []
    with trio.fail_after(60):
        async with serving_http(sup) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30) as c:

                async def one(i: int) -> None:
                    body = {"model": "a", "messages": [{"role": "user", "content": "w " * (i + 1)}], "max_tokens": 3 + i % 4}
                    if i % 2:
                        body |= {"stream": True, "stream_options": {"include_usage": True}}
                        r = await c.post("/v1/chat/completions", json=body)
                        last = [ln for ln in r.text.splitlines() if ln.startswith("data: {")][-1]
                        usages.append(httpx.Response(200, content=last[6:]).json()["usage"])
                    else:
                        r = await c.post("/v1/chat/completions", json=body)
                        usages.append(r.json()["usage"])
                    assert r.status_code == 200

                async with trio.open_nursery() as nursery:  # 24 at once on 2 slots: some wait
                    for i in range(N):
                        nursery.start_soon(one, i)
                assert (await c.post("/v1/chat/completions", json={"model": "nope", "messages": []})).status_code == 404
                assert (await c.get("/no/such/route")).status_code == 404
                assert (await c.post("/v1/embeddings", json={"model": "e", "input": "a b c"})).status_code == 200
                text = (await c.get("/metrics")).text
    m = _samples(text)  # parses, or raises
    chat = {"model": "a", "endpoint": "/v1/chat/completions"}
    assert _value(m, "corral_requests_total", status="200", **chat) == N
    assert _value(m, "corral_requests_total", model="", endpoint="/v1/chat/completions", status="404") == 1
    assert _value(m, "corral_requests_total", model="", endpoint="unmatched", status="404") == 1
    assert _value(m, "corral_requests_total", model="e", endpoint="/v1/embeddings", status="200") == 1
    assert _value(m, "corral_request_duration_seconds_count", **chat) == N
    for histogram in ("time_to_first_token", "time_per_output_token", "slot_queue", "load_queue"):
        assert _value(m, f"corral_{histogram}_seconds_count", model="a") == N, histogram
    assert _value(m, "corral_slot_queue_seconds_sum", model="a") > 0  # 24 requests on 2 slots waited
    assert _value(m, "corral_generation_tokens_total", model="a") == sum(u["completion_tokens"] for u in usages)
    assert _value(m, "corral_prompt_tokens_total", model="a") == sum(u["prompt_tokens"] for u in usages)
    assert _value(m, "corral_prompt_tokens_cached_total", model="a") == 0  # the fake caches nothing
    assert _value(m, "corral_prompt_tokens_total", model="e") == 4  # three words and BOS
    # Histogram buckets are cumulative and end with every observation.
    assert _value(m, "corral_time_to_first_token_seconds_bucket", model="a", le="+Inf") == N


async def test_a_scheduler_reads_the_queue_the_running_and_the_kv_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Gateway API Inference Extension's model server protocol, per model, as gauges:
    TotalQueuedRequests, TotalRunningRequests, KVCacheUtilization (a fraction)."""
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC", "5")
    sup = Supervisor(make_config(tmp_path, {"a": {"slots": 1}, "b": {}}), worker_command=WORKER_COMMAND)
    with trio.fail_after(60):
        async with serving_http(sup) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30) as c:
                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(partial(
                            c.post, "/v1/chat/completions",
                            json={"model": "a", "messages": [{"role": "user", "content": "w"}], "max_tokens": 200},
                        ))
                    # Until one decodes and the worker holds the next one ahead of its slot
                    # (the slot line's lookahead), which the line counts already.
                    while True:
                        m = _samples((await c.get("/metrics")).text)
                        if _value(m, "corral_model_requests_running", model="a") == 1 and _value(m, "corral_model_worker_queued", model="a") == 1:
                            break
                        await trio.sleep(0.05)
                    assert _value(m, "corral_model_requests_waiting", model="a") == 2
                    assert _value(m, "corral_model_requests_waiting", model="b") == 0
                    assert _value(m, "corral_model_requests_running", model="b") == 0
                    assert ("corral_model_kv_cache_usage_ratio", (("model", "b"),)) in m  # 0, not absent, while unloaded
                    assert _value(m, "corral_model_kv_cache_usage_ratio", model="b") == 0
                    assert 0 <= _value(m, "corral_model_kv_cache_usage_ratio", model="a") <= 1
                    # Typed: the picker reads a family without its TYPE line as 0.
                    lines = (await c.get("/metrics")).text.splitlines()
                    assert all(f"# TYPE {name} gauge" in lines for name in MODEL_SERVER_GAUGES.values())
                    nursery.cancel_scope.cancel()
