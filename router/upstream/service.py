"""Upstream models in the server: the replicas' state, one HTTP client for relaying,
checking and asking the fleet, the hook that relays, and the health-check task that
`corral serve` runs."""

from __future__ import annotations

import http.cookiejar
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

import httpx
import trio
from quart import Response
from quart_trio import QuartTrio

from router.upstream import checks, fleet, routing
from router.upstream.pool import LocalLoad, Upstreams, replica_view
from router.upstream.relay import VIA_TOKEN, Relay
from supervisor.supervisor import Supervisor

EXTENSION = "corral.upstreams"

# httpx logs every request at INFO; the access log already has one line per request.
logging.getLogger("httpx").setLevel(logging.WARNING)
# httpcore's DEBUG trace (`corral serve --log-level debug`) writes each upstream answer's
# headers as they came, before router/upstream/scrub.py sees them: an upstream that
# echoes its key in a header would put it in the log.
logging.getLogger("httpcore").setLevel(logging.WARNING)


class UpstreamService:
    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.pool = Upstreams(lambda: supervisor.config, self._local_load)
        # One client, so that connections to each replica are kept alive and reused. Its
        # own limits would queue requests silently: max_concurrency is the bound instead.
        # No cookie jar: one upstream's Set-Cookie must never ride on the next request, to
        # it or to another upstream, for another client.
        self.client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            cookies=http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[])),
        )
        # This server's name in a relayed request's Via header (router/upstream/relay.py).
        self.via_name = f"{VIA_TOKEN}{secrets.token_hex(6)}"
        self.relay = Relay(self.pool, self.client, f"1.1 {self.via_name}")

    def _local_load(self, name: str) -> LocalLoad | None:
        handle = self.supervisor.handles.get(name)
        if handle is None:
            return None
        stats = handle.statistics()
        return LocalLoad(handle.in_flight, stats.slots_busy >= stats.slots and stats.queued + stats.waiting > 0)

    def view(self) -> list[dict[str, Any]]:
        """Every upstream model with its replicas, for /admin/models and `corral status`."""
        return [
            {"name": spec.name, "model": spec.model, "local": spec.local, "replicas": replica_view(self.pool, spec)}
            for spec in self.pool.specs()
        ]

    def readiness(self, name: str) -> Response | None:
        """`GET /health?model=NAME` for a model served elsewhere only: ready while any
        replica is in rotation (None: not such a model; a key's scope does not apply, as
        /health needs none)."""
        spec = self.pool.spec(name)
        if spec is None or spec.local:
            return None
        up = [url for url in spec.urls if self.pool.of(spec.name, url).health.healthy]
        body = {"status": "ok" if up else "unavailable", "model": spec.name, "state": "ready" if up else "failed",
                "replicas_up": len(up), "replicas": len(spec.urls)}
        return Response(json.dumps(body), status=200 if up else 503, content_type="application/json")

    async def fleet(self) -> list[dict[str, Any]]:
        """The other servers of [server] fleet, each with its /admin/models or why none."""
        config = self.supervisor.config
        return await fleet.gather(self.client, list(config.server.fleet), config.fleet_key)

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.pool.state.values())

    async def run(self) -> None:
        """Health-check the replicas until cancelled; then close the client."""
        try:
            await checks.watch(self.pool, self.client, lambda: self.supervisor.config.supervisor.health_interval)
        finally:
            with trio.CancelScope(shield=True):
                await self.client.aclose()


def install(app: QuartTrio, supervisor: Supervisor, dialect_of: Callable[[str], str]) -> UpstreamService:
    service = UpstreamService(supervisor)
    routing.install(app, supervisor, service.relay, dialect_of, service.via_name)
    app.extensions[EXTENSION] = service
    return service


def of(app: QuartTrio) -> UpstreamService:
    service = app.extensions[EXTENSION]
    assert isinstance(service, UpstreamService)
    return service
