"""`GET /metrics`: every model's state and requests, in Prometheus' text format.

Two kinds of series. The models' state is read from the supervisor when Prometheus
scrapes, from the same snapshot as `/admin/models`, and a scrape never touches a model's
idle timer. What requests did (counts, tokens, latencies) is counted as each request ends
(router/server/request_metrics.py).
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from quart import Response
from quart_trio import QuartTrio

from router.server import access_log
from router.server.request_metrics import RequestMetrics
from supervisor.lifecycle import State
from supervisor.stats import ModelStats
from supervisor.supervisor import Supervisor

# (metric suffix, ModelStats field, help); all per-model gauges, absent values are skipped.
_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("slots", "slots", "Slots (concurrent sequences) of the model's worker."),
    ("slots_busy", "slots_busy", "Slots decoding a request right now."),
    ("worker_queued", "queued", "Requests queued inside the worker for a free slot."),
    ("waiting", "waiting", "Requests in line for a slot (bounded by max_queue)."),
    ("in_flight", "in_flight", "Requests holding a lease on the model."),
    ("rss_bytes", "rss_bytes", "Resident memory of the model's worker process."),
    ("cost_bytes", "cost_bytes", "What the model counts for against memory_budget."),
    ("threads", "threads", "CPU threads per decode step."),
    ("load_seconds", "load_seconds", "How long the last load took."),
    ("last_used_timestamp_seconds", "last_used", "When the last inference request ended (Unix time)."),
    ("kv_cells_used", "kv_cells_used", "KV cells the worker's slots hold (as of its last ping)."),
)


class SupervisorCollector(Collector):
    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def collect(self) -> Iterable[Metric]:
        sup = self._supervisor
        stats = [h.statistics() for h in sup.handles.values()]
        state = GaugeMetricFamily(
            "corral_model_state", "1 for the lifecycle state each model is in.", labels=["model", "state"]
        )
        for m in stats:
            for s in State:
                state.add_metric([m.name, s.value], 1.0 if m.state is s else 0.0)
        yield state
        # The reason as a label, as kube-state-metrics does for a pod's waiting reason: an
        # alert on corral_model_state{state="failed"} can then say why without a second look.
        failed = GaugeMetricFamily(
            "corral_model_failed_info",
            "1 for each failed or backing-off model, with its last error as the `error` label.",
            labels=["model", "error"],
        )
        for m in stats:
            if m.state in (State.FAILED, State.BACKOFF):
                failed.add_metric([m.name, m.last_error or ""], 1.0)
        yield failed
        for suffix, key, doc in _GAUGES:
            family = GaugeMetricFamily(f"corral_model_{suffix}", doc, labels=["model"])
            for m in stats:
                value = getattr(m, key)
                if isinstance(value, (int, float)):
                    family.add_metric([m.name], float(value))
            yield family
        yield from _scheduling(stats)
        restarts = CounterMetricFamily(
            "corral_model_restarts", "Worker starts after the first one.", labels=["model"]
        )
        for m in stats:
            restarts.add_metric([m.name], float(m.restarts))
        yield restarts
        decoded = CounterMetricFamily(
            "corral_model_prompt_tokens_decoded",
            "Prompt tokens the running worker has decoded (as of its last ping); n > 1 choices "
            "decode their shared prompt once, a cached prefix not at all.",
            labels=["model"],
        )
        for m in stats:
            if m.prompt_tokens_decoded is not None:
                decoded.add_metric([m.name], float(m.prompt_tokens_decoded))
        yield decoded
        yield from _worker_counters(stats)
        yield GaugeMetricFamily(
            "corral_load_queue_length", "Requests waiting for room to load their model.",
            value=float(len(sup.admission.queued())),
        )
        yield GaugeMetricFamily(
            "corral_config_error", "1 while the last reload's config was invalid (the old one runs).",
            value=1.0 if sup.config_error else 0.0,
        )


# The model server protocol's metrics (Gateway API Inference Extension,
# docs/proposals/003-model-server-protocol) and Corral's gauge for each: deploy/k8s/
# names them to the endpoint picker, and its test reads them from here.
MODEL_SERVER_GAUGES = {
    "TotalQueuedRequests": "corral_model_requests_waiting",
    "TotalRunningRequests": "corral_model_requests_running",
    "KVCacheUtilization": "corral_model_kv_cache_usage_ratio",
}


def _scheduling(stats: list[ModelStats]) -> Iterable[Metric]:
    """The three gauges an inference scheduler reads to pick a pod: the Kubernetes Gateway
    API Inference Extension's model server protocol (TotalQueuedRequests,
    TotalRunningRequests, KVCacheUtilization as a fraction; vLLM's num_requests_waiting,
    num_requests_running and kv_cache_usage_perc), per model."""
    waiting = GaugeMetricFamily(
        MODEL_SERVER_GAUGES["TotalQueuedRequests"],
        "Requests waiting for a slot: in the router's line and inside the worker (TotalQueuedRequests).",
        labels=["model"],
    )
    running = GaugeMetricFamily(
        MODEL_SERVER_GAUGES["TotalRunningRequests"],
        "Sequences decoding now, one per choice of each request (TotalRunningRequests).",
        labels=["model"],
    )
    kv = GaugeMetricFamily(
        MODEL_SERVER_GAUGES["KVCacheUtilization"],
        "KV cells the slots hold over the cells of the model's context, 0 to 1 (KVCacheUtilization); "
        "0 while the model is not loaded.",
        labels=["model"],
    )
    for m in stats:
        waiting.add_metric([m.name], float(m.waiting))  # the line counts those the worker holds ahead of a slot
        running.add_metric([m.name], float(m.slots_busy))
        n_ctx = m.loaded.n_ctx if m.loaded is not None else 0
        kv.add_metric([m.name], min(1.0, (m.kv_cells_used or 0) / n_ctx) if n_ctx else 0.0)
    yield waiting
    yield running
    yield kv


# (metric, ModelStats field, help): counters the running worker reports in its pings.
_WORKER_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (
        "corral_model_kv_repairs",
        "kv_repairs",
        "Slots whose cached tokens and KV cells disagreed, found by the worker's check before a "
        "decode and dropped rather than served from (each one is a bug; as of the last ping).",
    ),
    (
        "corral_model_kv_prefixes_refused",
        "kv_prefixes_refused",
        "Cached prompt prefixes that matched but were decoded again, because the sliding "
        "window's KV cells no longer reached down to them (as of the last ping).",
    ),
)


# (key of ModelStats.prompt_cache, counter or gauge, help): the prompt cache's series, each
# `corral_model_prompt_cache_<key>` (worker/engine.py, cache_counts).
_PROMPT_CACHE: tuple[tuple[str, bool, str], ...] = (
    ("prompts_reused", True, "Prompts admitted with part of their tokens read from the cache (hits)."),
    ("prompts_missed", True, "Prompts admitted with none of their tokens in any cache (misses)."),
    ("tokens_reused", True, "Prompt tokens read from the cache instead of decoded (tokens saved)."),
    ("parked", False, "Finished prompts kept in the KV cache under sequences of their own now."),
    ("parked_hits", True, "Prompts whose prefix came from a parked entry."),
    ("parked_evictions", True, "Parked entries given up for KV room, for their sequence, or for being idle."),
    ("requests_parked", True, "Running requests parked for a waiting one of a better class (their cells kept)."),
    ("tokens_resumed", True, "Tokens a parked or preempted request found again in the cache when it came back."),
    ("spilled_idle", True, "Parked entries moved to host memory after going unused for 64 decode steps."),
    ("host_prompts", False, "Prompts saved in host memory now."),
    ("host_bytes", False, "Bytes of KV cells saved in host memory now."),
    ("host_evictions", True, "Saved prompts given up to stay within the host-memory budget."),
    ("restored", True, "Saved prompts written back into the KV cache (from host memory or disk)."),
    ("restore_failed", True, "Saved prompts llama.cpp would not take back (no room, or not matching)."),
    ("tokens_restored", True, "Prompt tokens served from saved prompts written back from host memory."),
    ("loaded_from_disk", False, "Saved prompts read from the cache folder when the model loaded."),
)
# Speculative decoding's, from the same Pong: `corral_model_speculative_<key>`.
_SPECULATIVE: tuple[tuple[str, str], ...] = (
    ("draft_tokens", "Draft tokens fed to the model for verification (n-gram lookup)."),
    ("draft_accepted", "Draft tokens the model's own samples agreed with (each one a token sooner)."),
)
# A vision model's images, from the same Pong: `corral_model_images_<key>` (worker/media/).
_IMAGES: tuple[tuple[str, str], ...] = (
    ("encoded", "Images run through the projector's encoder (the slow part of an image)."),
    ("reused", "Images whose encoding was kept from an earlier request (none run again)."),
)


def _worker_counters(stats: list[ModelStats]) -> Iterable[Metric]:
    for name, key, doc in _WORKER_COUNTERS:
        family = CounterMetricFamily(name, doc, labels=["model"])
        for m in stats:
            value = getattr(m, key)
            if value is not None:
                family.add_metric([m.name], float(value))
        yield family
    for key, counter, doc in _PROMPT_CACHE:
        name = f"corral_model_prompt_cache_{key}"
        cache: CounterMetricFamily | GaugeMetricFamily = (
            CounterMetricFamily(name, doc, labels=["model"]) if counter else GaugeMetricFamily(name, doc, labels=["model"])
        )
        for m in stats:
            if key in m.prompt_cache:
                cache.add_metric([m.name], float(m.prompt_cache[key]))
        yield cache
    for key, doc in _SPECULATIVE:
        spec = CounterMetricFamily(f"corral_model_speculative_{key}", doc, labels=["model"])
        for m in stats:
            if key in m.prompt_cache:
                spec.add_metric([m.name], float(m.prompt_cache[key]))
        yield spec
    for key, doc in _IMAGES:
        images = CounterMetricFamily(f"corral_model_images_{key}", doc, labels=["model"])
        for m in stats:
            if f"images_{key}" in m.prompt_cache:
                images.add_metric([m.name], float(m.prompt_cache[f"images_{key}"]))
        yield images


def register(app: QuartTrio, supervisor: Supervisor, more: Iterable[Collector] = ()) -> None:
    """`more`: other parts' series (the upstream replicas')."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SupervisorCollector(supervisor))
    for collector in more:
        registry.register(collector)
    # Request series, fed as each request ends (router/server/request_metrics.py).
    app.extensions.setdefault(access_log.DONE_HOOKS, []).append(RequestMetrics(registry).observe)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
