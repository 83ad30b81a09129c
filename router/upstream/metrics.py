"""Upstream replicas in `GET /metrics`: whether each is in rotation, its requests in flight,
and how its requests ended. Read from the pool when Prometheus scrapes."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.upstream.pool import Upstreams


class UpstreamCollector(Collector):
    def __init__(self, upstreams: Upstreams) -> None:
        self._upstreams = upstreams

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily(
            "corral_upstream_up", "1 while the replica is in rotation (health checks and requests).", labels=["model", "replica"]
        )
        in_flight = GaugeMetricFamily(
            "corral_upstream_in_flight", "Requests relayed to the replica and not yet answered in full.", labels=["model", "replica"]
        )
        requests = CounterMetricFamily(
            "corral_upstream_requests",
            "Requests relayed to the replica, by outcome: ok (answered below 500), failed (5xx, or cut "
            "off mid-answer), failed_over (no answer, so another replica took it).",
            labels=["model", "replica", "outcome"],
        )
        for spec in self._upstreams.specs():
            for url in spec.urls:
                s = self._upstreams.of(spec.name, url)
                up.add_metric([spec.name, url], 1.0 if s.health.healthy else 0.0)
                in_flight.add_metric([spec.name, url], float(s.in_flight))
                for outcome in ("ok", "failed", "failed_over"):
                    requests.add_metric([spec.name, url, outcome], float(s.outcomes[outcome]))
        yield from (up, in_flight, requests)
