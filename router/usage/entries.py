"""One finished request as the ledger counts it, and the periods it is counted in. Pure.

A request is counted once, when its answer is done (router/server/access_log.py hands its
record to the DONE hooks): its key, its model, its tokens as the access log counted them
(what the client saw, a stream cut short included), whether it failed, and how long it
waited in line for a slot. Periods are UTC hours, rolled up into UTC days once old
(router/usage/store.py): a day is then the same day for every operator and every client.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.server.access_log import Record

HOUR = 3600
DAY = 86400


@dataclass(frozen=True)
class Entry:
    at: float  # wall clock (epoch seconds) when the answer was done
    key: str  # the key's name ("" without one); never the key
    key_id: str  # its owner digest's first 16 hex digits ("" without a key): names change
    model: str  # "" when the request never named a model it may use
    prompt_tokens: int = 0  # cached ones included, as OpenAI's usage counts them
    cached_tokens: int = 0
    generated_tokens: int = 0
    error: bool = False
    queue_seconds: float = 0.0  # in line for a slot

    @property
    def tokens(self) -> int:
        """What a token quota charges: prompt and generated (OpenAI's TPM counts both)."""
        return self.prompt_tokens + self.generated_tokens


def hour_of(at: float) -> int:
    return int(at // HOUR) * HOUR


def day_of(at: float) -> int:
    return int(at // DAY) * DAY


def counted(record: Record) -> bool:
    """Whether a request goes in the ledger: one that named a model or presented a key, on
    a route that is not the operator's own (/admin, /metrics) nor the open ones."""
    path = record.path
    if path == "/metrics" or path == "/admin" or path.startswith("/admin/") or path in ("/health", "/v1/health", "/"):
        return False
    return record.model is not None or record.key is not None


def failed(record: Record) -> bool:
    """An error the client got (a status of 400 or more), or an answer that broke off at
    an upstream. A client that left mid-stream did not get an error: its tokens count."""
    return (record.status is not None and record.status >= 400) or record.upstream_broke


def of(record: Record, at: float) -> Entry:
    return Entry(
        at=at,
        key=record.key or "",
        key_id=(record.key_id or "")[:16],
        model=record.model or "",
        prompt_tokens=record.prompt_tokens or 0,
        cached_tokens=record.cached_tokens,
        generated_tokens=record.generated_tokens or 0,
        error=failed(record),
        queue_seconds=record.slot_wait or 0.0,
    )
