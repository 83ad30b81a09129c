"""Which replica serves a request: a pure function of what the router knows about each.

A model with several replicas (upstream URLs, and optionally its local worker) sends each
request to one of them. The rules, in order:

1. Only replicas that can take it: healthy (router/upstream/health.py), not already tried
   for this request (failover excludes the one that just failed), and under their
   `max_concurrency`.
2. The local worker is passed over while its slot line is full, if a remote replica can
   take the request (spill-over); when none can, it still queues the request locally.
3. Affinity with a bound on load: replicas are ranked by rendezvous hashing of the request's
   session key, and the first in that order whose requests in flight stay within `SLACK`
   times the average (counting this request) serves it. A conversation thus returns to the
   replica that holds its prompt cache, unless that replica is busier than the others by
   more than the slack; then it moves to the next replica in its own order, the same one each
   time, so that its cache is rebuilt in one place. This is consistent hashing with bounded
   loads (Mirrokni, Thorup and Zadimoghaddam, 2018), which HAProxy's `hash-balance-factor`
   and Envoy's ring-hash load balancer implement too.
4. A request without a session key is given a random one by the caller, so that it goes to
   one of the least busy replicas, ties falling at random.

Removing or adding a replica moves only the conversations that hashed to it, which is why
ranking is by rendezvous hashing and not by `hash % len(replicas)`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

# A replica serves its conversations while it has at most this many times the average
# requests in flight (HAProxy's hash-balance-factor 125).
SLACK = 1.25


@dataclass(frozen=True)
class Replica:
    name: str  # its URL, or "local" for the model's own worker
    in_flight: int = 0
    healthy: bool = True
    limit: int | None = None  # max_concurrency: no more requests in flight than this
    local: bool = False
    line_full: bool = False  # the local worker's slot line is full: spill over if possible

    def has_room(self) -> bool:
        return self.limit is None or self.in_flight < self.limit


def rank(key: str, names: Sequence[str]) -> list[str]:
    """`names` in the rendezvous-hashing order of `key`: highest weight first."""

    def weight(name: str) -> bytes:
        return hashlib.blake2b(f"{name}\0{key}".encode(), digest_size=8).digest()

    return sorted(names, key=weight, reverse=True)


def pick(
    replicas: Sequence[Replica], key: str, tried: frozenset[str] = frozenset(), prefer: str | None = None
) -> Replica | None:
    """The replica that serves a request with session key `key`, or None when no replica
    can take it (all down, tried, or at their limit). `prefer` names the replica known to
    hold the conversation's cache (a local instance that served it last): it comes first,
    under the same bound, ahead of the rendezvous order, which a replica that was cold when
    the conversation began would otherwise win back and so lose the cache."""
    able = [r for r in replicas if r.healthy and r.name not in tried and r.has_room()]
    spill = [r for r in able if not (r.local and r.line_full)]
    pool = spill or able
    if not pool:
        return None
    # Bounded load: this request counted, every replica may hold SLACK times the average.
    bound = math.ceil(SLACK * (sum(r.in_flight for r in pool) + 1) / len(pool))
    by_name = {r.name: r for r in pool}
    order = [by_name[n] for n in rank(key, list(by_name))]
    if prefer in by_name:
        order.sort(key=lambda r: r.name != prefer)  # stable: the rest keep their rank
    # One always qualifies: the least busy replica is at or below the average, and the bound
    # is above it (the test checks that a pick exists whenever a replica can take it).
    return next(r for r in order if r.in_flight + 1 <= bound)
