"""What requests did, for Prometheus: counts, tokens and latencies, per model.

Every series is fed once per request, when its answer is done, from the access log's record
(router/server/access_log.py): nothing is counted per token or on the decode path, so counting
costs each request a few dictionary lookups, however long it runs.

The series follow vLLM's and llama-server's meanings, renamed under `corral_`, so that their
dashboards translate:

| Corral | vLLM |
|---|---|
| corral_requests_total{model,endpoint,status} | vllm:request_success_total (by status here) |
| corral_prompt_tokens_total{model} | vllm:prompt_tokens_total |
| corral_generation_tokens_total{model} | vllm:generation_tokens_total |
| corral_prompt_tokens_cached_total{model} | vllm:prefix_cache_hits (in tokens) |
| corral_time_to_first_token_seconds{model} | vllm:time_to_first_token_seconds |
| corral_time_per_output_token_seconds{model} | vllm:time_per_output_token_seconds |
| corral_request_duration_seconds{model,endpoint} | vllm:e2e_request_latency_seconds |
| corral_slot_queue_seconds{model} | vllm:request_queue_time_seconds |
| corral_load_queue_seconds{model} | (none: vLLM serves one model) |

Labels stay bounded whatever clients send: `endpoint` is the route's rule (an address that
matches no route is "unmatched"), and `model` a configured model's name ("" before one
was resolved).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from router.server.access_log import Record

# Latency buckets (seconds), as vLLM's: from a cached short answer to a long stream.
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_REQUEST = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)
_QUEUE = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class RequestMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "corral_requests", "Requests answered, by route and status.",
            ["model", "endpoint", "status"], registry=registry,
        )
        self.prompt_tokens = Counter(
            "corral_prompt_tokens", "Prompt tokens of finished requests (cached ones included).",
            ["model"], registry=registry,
        )
        self.cached_tokens = Counter(
            "corral_prompt_tokens_cached", "Prompt tokens served from the prefix cache, not decoded.",
            ["model"], registry=registry,
        )
        self.generation_tokens = Counter(
            "corral_generation_tokens", "Tokens generated.", ["model"], registry=registry,
        )
        self.ttft = Histogram(
            "corral_time_to_first_token_seconds", "From a request's arrival to its first token.",
            ["model"], buckets=_TTFT, registry=registry,
        )
        self.tpot = Histogram(
            "corral_time_per_output_token_seconds", "Between a request's tokens after its first.",
            ["model"], buckets=_TPOT, registry=registry,
        )
        self.duration = Histogram(
            "corral_request_duration_seconds", "From a request's arrival to the end of its answer.",
            ["model", "endpoint"], buckets=_REQUEST, registry=registry,
        )
        self.slot_wait = Histogram(
            "corral_slot_queue_seconds", "Time a generation waited in line for a slot.",
            ["model"], buckets=_QUEUE, registry=registry,
        )
        self.load_wait = Histogram(
            "corral_load_queue_seconds", "Time a generation waited for its model to load (or for room).",
            ["model"], buckets=_QUEUE, registry=registry,
        )

    def observe(self, r: Record) -> None:
        """One finished request (router/server/access_log.py calls it for each)."""
        model = r.model or ""
        endpoint = r.route or "unmatched"
        self.requests.labels(model, endpoint, str(r.status or 0)).inc()
        if r.ended is not None:
            self.duration.labels(model, endpoint).observe(r.ended - r.started)
        if r.prompt_tokens is not None:
            self.prompt_tokens.labels(model).inc(r.prompt_tokens)
            self.cached_tokens.labels(model).inc(r.cached_tokens)
        if r.generated_tokens is not None:
            self.generation_tokens.labels(model).inc(r.generated_tokens)
        if r.first_token is not None:
            self.ttft.labels(model).observe(r.first_token - r.started)
            if r.ended is not None and r.generated_tokens is not None and r.generated_tokens > 1:
                self.tpot.labels(model).observe((r.ended - r.first_token) / (r.generated_tokens - 1))
        if r.slot_wait is not None:
            self.slot_wait.labels(model).observe(r.slot_wait)
        if r.load_wait is not None:
            self.load_wait.labels(model).observe(r.load_wait)
