"""A model's lifecycle states and the transitions between them, in one place.

A leaf module with no imports from the project, like supervisord's states module. The
handle's run loop is the only writer of a state; it asks `check` before every transition,
so an edge that is not in the table is a bug that fails loudly instead of a silent drift.
Load is a counter (requests in flight), not a state.
"""

from __future__ import annotations

import enum


class State(enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    FAILED = "failed"


S = State

TRANSITIONS: frozenset[tuple[State, State]] = frozenset(
    {
        (S.STOPPED, S.STARTING),  # STOPPED -> STARTING: a request asked for the model
        (S.STOPPED, S.FAILED),  # STOPPED -> FAILED: its file cannot load, seen before any start
        (S.STARTING, S.READY),  # STARTING -> READY: the worker sent Ready
        (S.STARTING, S.BACKOFF),  # STARTING -> BACKOFF: failed start, retries remain
        (S.STARTING, S.FAILED),  # STARTING -> FAILED: failed start, no retries left
        (S.STARTING, S.STOPPING),  # STARTING -> STOPPING: shutdown during load
        (S.READY, S.DRAINING),  # READY -> DRAINING: unload/reload asked, requests in flight
        (S.READY, S.STOPPING),  # READY -> STOPPING: idle timeout, or shutdown
        (S.READY, S.STOPPED),  # READY -> STOPPED: the worker crashed after min_uptime
        (S.READY, S.BACKOFF),  # READY -> BACKOFF: it died before min_uptime, retries remain
        (S.READY, S.FAILED),  # READY -> FAILED: it died before min_uptime, no retries left
        (S.DRAINING, S.STOPPING),  # DRAINING -> STOPPING: the last request finished
        (S.DRAINING, S.READY),  # DRAINING -> READY: a reload restored its config, or added it back
        (S.DRAINING, S.STOPPED),  # DRAINING -> STOPPED: the worker exited while draining
        (S.STOPPING, S.STOPPED),  # STOPPING -> STOPPED: the worker is gone
        (S.BACKOFF, S.STARTING),  # BACKOFF -> STARTING: the delay passed
        (S.BACKOFF, S.STOPPED),  # BACKOFF -> STOPPED: shutdown or reset
        (S.BACKOFF, S.FAILED),  # BACKOFF -> FAILED: its file cannot load, seen before the retry
        (S.FAILED, S.STOPPED),  # FAILED -> STOPPED: admin reset or config reload
    }
)


class IllegalTransition(RuntimeError):
    pass


def check(old: State, new: State) -> None:
    if (old, new) not in TRANSITIONS:
        raise IllegalTransition(f"{old.value} -> {new.value} is not a valid transition")
