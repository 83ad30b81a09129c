"""Which instance of a model of several (`instances = N`) serves a request, and failing
over to another when the chosen one could not start it.

The rules are the upstream replicas' (router/upstream/choice.py), with each instance a
local replica: healthy unless failed or backing off, its slot line "full" while it is not
loaded or while every slot is busy and requests wait, so that a loaded instance with room
is preferred to loading another. The session key is the replicas' too (router/upstream/
affinity.py), read by a hook before the route (router/server/instance_key.py); a request
without one goes to one of the least busy. On top, the group remembers where each
conversation was served last (`ModelGroup.served_on`), valid while that worker still
runs, and prefers it: the instance that holds its prefix in its cache.

Failover (as router/upstream/relay.py's, before any output): a request an instance could
not start (its worker gone before the request reached it, or before its first token; the
instance stopped or failed while it waited) is retried on another instance not tried yet.
A request one instance's full line refused (max_queue's 429) goes to another too, at once.
Once Generation.start has returned, the first event is out and nothing is retried. A
request that the worker already held when it died may have killed it (model_loop.py
presumes so), so it is retried once at most, never on every instance in turn.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from router.upstream.choice import Replica, pick
from supervisor.errors import Overloaded, WorkerCrashed, WorkerUnavailable
from supervisor.group import ModelGroup
from supervisor.handle import ModelHandle
from supervisor.lifecycle import State

T = TypeVar("T")
# Conversations remembered per model (an LRU): a few MB at most.
REMEMBERED = 65536


@dataclass
class Attempt:
    """One try of a request on one instance."""

    sent: bool = False  # the request reached the worker, which held it if it died


def replicas(group: ModelGroup) -> list[Replica]:
    """Each instance as the replica choice sees it."""
    out = []
    for h in group.instances:
        conn = h.conn
        ready = h.state is State.READY and conn is not None and not conn.closed.is_set()
        slots = conn.ready.slots if ready and conn is not None and conn.ready is not None else h.spec.slots
        busy = conn is not None and conn.active >= slots and conn.queued + h.slot_queue.waiting > 0
        out.append(
            Replica(
                h.name, h.in_flight, healthy=h.state not in (State.FAILED, State.BACKOFF) and not h.leaving,
                local=True, line_full=not ready or busy,
            )
        )
    return out


def preferred(group: ModelGroup, key: str) -> str | None:
    """The instance that served this conversation last, if its worker still runs."""
    seen = group.served_on.get(key)
    if seen is None:
        return None
    label, starts = seen
    h = next((h for h in group.instances if h.name == label), None)
    return label if h is not None and h.state is State.READY and h.starts == starts else None


def choose(group: ModelGroup, key: str, tried: frozenset[str] = frozenset()) -> ModelHandle | None:
    """The instance for a request with session key `key`, or None if none can take it."""
    chosen = pick(replicas(group), key, tried, preferred(group, key))
    return None if chosen is None else next(h for h in group.instances if h.name == chosen.name)


def remember(group: ModelGroup, key: str, h: ModelHandle) -> None:
    """`h` started the conversation `key`'s request: its cache holds the prefix now."""
    if key.startswith("random:"):
        return
    group.served_on[key] = (h.name, h.starts)
    group.served_on.move_to_end(key)
    while len(group.served_on) > REMEMBERED:
        group.served_on.popitem(last=False)


def may_retry(exc: Exception, h: ModelHandle, attempt: Attempt, held_before: bool) -> bool:
    """Whether a request that failed this way on `h` goes to another instance."""
    if isinstance(exc, WorkerCrashed):
        return not (attempt.sent and held_before)  # a possible killer: once at most
    if isinstance(exc, Overloaded):
        return True  # refused at once, past max_queue: another instance's line may have room
    # An instance that stopped, failed or backs off; not a full line or a queue timeout on
    # one that serves (the request's own wait, which another line would only repeat).
    return isinstance(exc, WorkerUnavailable) and h.state is not State.READY


async def run_on_instance(
    group: ModelGroup, key: str | None, run: Callable[[ModelHandle, Attempt], Awaitable[T]]
) -> T:
    """`run` the request on the instance chosen for session key `key` (None: any of the
    least busy), and on another while it fails to start as `may_retry` allows."""
    key = key or f"random:{random.random()}"
    tried: set[str] = set()
    held = False  # a worker already died holding it
    last: Exception | None = None
    while True:
        h = choose(group, key, frozenset(tried))
        if h is None:
            if last is not None:
                raise last
            h = group.least_busy()  # none is healthy: its own error is the answer
        attempt = Attempt()
        try:
            result = await run(h, attempt)
        except (WorkerCrashed, WorkerUnavailable, Overloaded) as exc:
            if h.name in tried or not may_retry(exc, h, attempt, held):
                raise
            held = held or (isinstance(exc, WorkerCrashed) and attempt.sent)
            tried.add(h.name)
            group.failed_over += 1
            last = exc
            continue
        remember(group, key, h)
        return result
