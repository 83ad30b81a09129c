"""A key's standing against its quotas as the rate-limit headers its clients read. Pure.

OpenAI's API sends `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` on every answer,
its resets as Go durations ("1s", "6m0s"); Anthropic's sends
`anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`, its resets as RFC 3339
times. Each dialect's routes carry their API's family (the Anthropic Messages routes
Anthropic's; every other route OpenAI's, which llama-server's and Ollama's clients ignore).
Only a key with quotas gets them: a figure for a limit that does not exist would mislead.
"""

from __future__ import annotations

import datetime as dt
from typing import Callable

from router.usage.quotas import Standing


def go_duration(seconds: float) -> str:
    """Seconds as Go prints a time.Duration, OpenAI's format: "20ms", "1.5s", "6m0s"."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    frac = seconds - whole
    sec = f"{s + frac:.3f}".rstrip("0").rstrip(".") if frac >= 0.001 else str(s)
    if h:
        return f"{h}h{m}m{sec}s"
    if m:
        return f"{m}m{sec}s"
    return f"{sec}s"


def _family(st: Standing, name: Callable[[str, str], str], reset: Callable[[float], str]) -> dict[str, str]:
    """The headers of each limit `st` has: `name(kind, field)` spells a header."""
    out: dict[str, str] = {}
    for kind, limit, remaining, seconds in (
        ("requests", st.requests_limit, st.requests_remaining, st.requests_reset),
        ("tokens", st.tokens_limit, st.tokens_remaining, st.tokens_reset),
    ):
        if limit is not None and remaining is not None:
            out[name(kind, "limit")] = str(limit)
            out[name(kind, "remaining")] = str(remaining)
            out[name(kind, "reset")] = reset(seconds)
    return out


def openai(st: Standing) -> dict[str, str]:
    return _family(st, lambda kind, field: f"x-ratelimit-{field}-{kind}", go_duration)


def anthropic(st: Standing, wall: float) -> dict[str, str]:
    def at(seconds: float) -> str:
        when = dt.datetime.fromtimestamp(wall + seconds, dt.timezone.utc).replace(microsecond=0)
        return when.isoformat().replace("+00:00", "Z")

    return _family(st, lambda kind, field: f"anthropic-ratelimit-{kind}-{field}", at)
