"""One model's numbers at one moment: what `/admin/models` and `/metrics` show. Taken by
`ModelHandle.statistics()`, so that readers never reach into a handle or its worker
connection. `/admin/models` encodes it as it is: the fields' order is the JSON's."""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.lifecycle import State


@dataclass(frozen=True)
class ModelStats:
    name: str
    aliases: tuple[str, ...]
    state: State
    pid: int | None
    rss_bytes: int | None  # measured now; None without a worker
    slots: int  # the worker's, once Ready; the config's before
    slots_busy: int  # as the worker last reported (it reports every change)
    queued: int  # waiting inside the worker for a slot, or still being prepared
    in_flight: int  # requests holding a lease
    last_used: float | None  # time.time() when the last inference request ended
    load_seconds: float | None
    restarts: int  # worker starts after the first
    last_error: str | None
    pinned: bool
    # What the model counts for against memory_budget: its worker's RSS once loaded, the
    # GGUF size plus KV cache before.
    cost_bytes: int
    # CPU threads per decode: the config's `threads`, or its share of the cores.
    threads: int | None
