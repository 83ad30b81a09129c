"""What the router knows of each upstream replica while it serves: its health, its
requests in flight, what it has served. The decisions are pure (choice.py, health.py);
this holds their inputs between requests.

State is kept by (model, URL), so that a reload that keeps a replica keeps its health and
its count, and one that drops it forgets it at the next health round.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from router.upstream.choice import Replica
from router.upstream.health import Health
from router.upstream.scrub import Scrubber
from supervisor.config import Config
from supervisor.config.schema import UpstreamSpec

log = logging.getLogger("corral.upstream")

# A connection refused is a dead host: it leaves rotation at once, as with HAProxy's
# `observe layer4` and `on-error mark-down`. Slow or 5xx answers take FALL in a row.
DEAD = 1

LOCAL = "local"  # the name of the replica that is the model's own worker


@dataclass
class ReplicaState:
    health: Health = field(default_factory=Health)
    in_flight: int = 0
    # Requests by how they ended: "ok" (answered below 500: a 4xx is the replica working),
    # "failed" (a 5xx, a break mid-answer, a redirect), "failed_over" (no answer, so
    # another replica took it).
    outcomes: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class LocalLoad:
    """The model's own worker as a replica: requests it holds, and whether its slot line
    is full (every slot busy and requests waiting), so that a remote replica takes more."""

    in_flight: int
    line_full: bool


class Upstreams:
    def __init__(self, config: Callable[[], Config], local: Callable[[str], LocalLoad | None]) -> None:
        self._config = config
        self._local = local
        self.state: dict[tuple[str, str], ReplicaState] = {}
        self._keys: set[str] = set()
        self._keys_of: Config | None = None  # the config whose keys _keys holds
        self._scrubber = Scrubber(())

    def spec(self, name: str) -> UpstreamSpec | None:
        """The upstream model `name` (or an alias) names, in the config as it is now."""
        return self._config().upstream(name)

    def specs(self) -> list[UpstreamSpec]:
        return list(self._config().upstreams.values())

    def scrubber(self) -> Scrubber:
        """What takes the keys out of an upstream's text (router/upstream/scrub.py): every
        key this server has sent to another server since it started, upstreams' and the
        fleet's, so that an answer to a request sent with a key a reload has since
        replaced is scrubbed of it too. Built again only when a reload brings a new key."""
        config = self._config()
        if config is not self._keys_of:
            self._keys_of = config
            keys = {s.api_key for s in config.upstreams.values() if s.api_key}
            keys |= {config.fleet_key} if config.fleet_key else set()
            if not keys <= self._keys:
                self._keys |= keys
                self._scrubber = Scrubber(self._keys)
        return self._scrubber

    def of(self, model: str, url: str) -> ReplicaState:
        return self.state.setdefault((model, url), ReplicaState())

    def replicas(self, spec: UpstreamSpec) -> list[Replica]:
        """`spec`'s replicas as the choice sees them, its own worker last."""
        out: list[Replica] = []
        for url in spec.urls:
            s = self.of(spec.name, url)
            out.append(Replica(url, s.in_flight, s.health.healthy, spec.max_concurrency))
        if spec.local and (load := self._local(spec.name)) is not None:
            out.append(Replica(LOCAL, load.in_flight, True, None, local=True, line_full=load.line_full))
        return out

    def observe(self, model: str, url: str, ok: bool, error: str | None = None, dead: bool = False) -> None:
        """A health check's or a request's outcome at replica `url` of `model`."""
        state = self.of(model, url)
        before = state.health.healthy
        state.health = state.health.observe(ok, error, **({"fall": DEAD} if dead else {}))
        if before != state.health.healthy:
            if state.health.healthy:
                log.warning("upstream %s of model %s is back in rotation", url, model)
            else:
                log.warning("upstream %s of model %s is out of rotation (%s)", url, model, error)

    def forget_removed(self) -> None:
        """Drop the state of replicas no longer in the config (after a reload)."""
        live = {(u.name, url) for u in self.specs() for url in u.urls}
        for key in [k for k, s in self.state.items() if k not in live and s.in_flight == 0]:
            del self.state[key]


def replica_view(upstreams: Upstreams, spec: UpstreamSpec, operator: bool = True) -> list[dict[str, object]]:
    """Each remote replica of `spec` as /v1/models and /admin/models show it. `operator`
    False (a client's API key, on a server with keys): where the replicas are and what
    went wrong there are the operator's to know, as a local model's file path is; the
    client sees how many are in rotation and how busy."""
    out: list[dict[str, object]] = []
    for i, url in enumerate(spec.urls):
        s = upstreams.of(spec.name, url)
        view: dict[str, object] = {"replica": i, "healthy": s.health.healthy, "in_flight": s.in_flight}
        if operator:
            view.update(url=url, last_error=s.health.last_error, requests=dict(s.outcomes))
        out.append(view)
    return out
