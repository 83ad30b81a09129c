"""Whether a replica is in rotation: consecutive health-check results, as HAProxy counts
them (`fall`, `rise`).

A replica leaves rotation after `fall` failures in a row and comes back after `rise`
successes in a row, so that one slow answer does not flap it out and one lucky answer does
not bring a broken host back. A request that fails to connect counts as a failed check:
the router learns of a dead host from its traffic sooner than from the next check.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

FALL = 3  # HAProxy's defaults
RISE = 2


@dataclass(frozen=True)
class Health:
    healthy: bool = True  # a new replica is tried at once, as HAProxy's are
    failures: int = 0  # in a row
    successes: int = 0  # in a row
    last_error: str | None = None

    def observe(self, ok: bool, error: str | None = None, fall: int = FALL, rise: int = RISE) -> Health:
        """The state after one check (or request) that succeeded or failed."""
        if ok:
            successes = self.successes + 1
            healthy = self.healthy or successes >= rise
            return replace(self, healthy=healthy, failures=0, successes=successes,
                           last_error=self.last_error if not healthy else None)
        failures = self.failures + 1
        return replace(self, healthy=self.healthy and failures < fall, failures=failures, successes=0,
                       last_error=error or "health check failed")
