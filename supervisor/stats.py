"""One model's numbers at one moment: what `/admin/models` and `/metrics` show. Taken by
`ModelHandle.statistics()`, so that readers never reach into a handle or its worker
connection. `/admin/models` encodes it as it is: the fields' order is the JSON's."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from supervisor.lifecycle import State
from worker.protocol import Ready


@dataclass(frozen=True)
class LoadedFacts:
    """What the running worker found in the model file and built: its answer in `Ready`.
    It shows an operator what the config alone cannot, such as the context the model
    was trained for next to the one configured."""

    description: str  # llama.cpp's one-line description (architecture, size, quantization)
    n_ctx: int  # KV cells shared by every slot
    n_ctx_slot: int  # the most tokens (prompt + output) one request may hold
    n_ctx_train: int
    n_vocab: int
    n_embd: int
    has_template: bool  # a chat template, from the file or the config
    embeddings: bool
    max_token_bytes: int  # the longest token's bytes (0: no bound); the router's length bound

    @classmethod
    def of(cls, ready: Ready) -> LoadedFacts:
        # Ready's fields of the same names: one declared here is shown, with no copy to edit.
        return cls(**{f.name: getattr(ready, f.name) for f in fields(cls)})


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
    waiting: int  # in the router's line for a slot (supervisor/slot_queue.py)
    # `waiting` by the class each request stands in (its key's, or its own `priority`),
    # before aging: {"interactive": 0, "normal": 2, "batch": 5}.
    waiting_by_priority: dict[str, int]
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
    loaded: LoadedFacts | None  # None without a ready worker
    # Prompt tokens the running worker has fed to llama_decode, as of its last Pong (None
    # before one): n > 1 choices decode their shared prompt once.
    prompt_tokens_decoded: int | None = None
    kv_cells_used: int | None = None  # as of the last Pong
    kv_repairs: int | None = None  # as of the last Pong: worker/kv_cache.py
    kv_prefixes_refused: int | None = None
    # The prompt cache's counters and sizes as of the last Pong (worker/engine.py,
    # cache_counts); empty before one.
    prompt_cache: dict[str, int] = field(default_factory=dict)
    # Requests that took a lease in the last 60 s (supervisor/request_rate.py); a request
    # that failed before reaching the worker is not counted.
    requests_per_minute: int = 0
    # Tokens the running worker has generated since it started (None without one); the
    # dashboard's tokens per second is the difference between two readings.
    tokens_generated: int | None = None
    # What its prompts may hold besides text: its projector's ("vision", "audio").
    modalities: tuple[str, ...] = ()
    # The LoRA adapters its worker loads, by file name (supervisor/config/lora.py).
    lora: tuple[str, ...] = ()
