"""Upstream models in the server: the replicas' state, one HTTP client for relaying and
checking, the hook that relays, and the health-check task that `corral serve` runs."""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import trio
from quart_trio import QuartTrio

from router.upstream import checks, routing
from router.upstream.pool import LocalLoad, Upstreams
from router.upstream.relay import Relay
from supervisor.supervisor import Supervisor

EXTENSION = "corral.upstreams"

# httpx logs every request at INFO; the access log already has one line per request.
logging.getLogger("httpx").setLevel(logging.WARNING)


class UpstreamService:
    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.pool = Upstreams(lambda: supervisor.config, self._local_load)
        # One client, so that connections to each replica are kept alive and reused. Its
        # own limits would queue requests silently: max_concurrency is the bound instead.
        self.client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        self.relay = Relay(self.pool, self.client)

    def _local_load(self, name: str) -> LocalLoad | None:
        handle = self.supervisor.handles.get(name)
        if handle is None:
            return None
        stats = handle.statistics()
        return LocalLoad(handle.in_flight, stats.slots_busy >= stats.slots and stats.queued + stats.waiting > 0)

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
    routing.install(app, supervisor, service.relay, dialect_of)
    app.extensions[EXTENSION] = service
    return service


def of(app: QuartTrio) -> UpstreamService:
    service = app.extensions[EXTENSION]
    assert isinstance(service, UpstreamService)
    return service
