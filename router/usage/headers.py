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


def openai(st: Standing) -> dict[str, str]:
    out: dict[str, str] = {}
    if st.requests_limit is not None and st.requests_remaining is not None:
        out["x-ratelimit-limit-requests"] = str(st.requests_limit)
        out["x-ratelimit-remaining-requests"] = str(st.requests_remaining)
        out["x-ratelimit-reset-requests"] = go_duration(st.requests_reset)
    if st.tokens_limit is not None and st.tokens_remaining is not None:
        out["x-ratelimit-limit-tokens"] = str(st.tokens_limit)
        out["x-ratelimit-remaining-tokens"] = str(st.tokens_remaining)
        out["x-ratelimit-reset-tokens"] = go_duration(st.tokens_reset)
    return out


def anthropic(st: Standing, wall: float) -> dict[str, str]:
    def at(seconds: float) -> str:
        when = dt.datetime.fromtimestamp(wall + seconds, dt.timezone.utc).replace(microsecond=0)
        return when.isoformat().replace("+00:00", "Z")

    out: dict[str, str] = {}
    if st.requests_limit is not None and st.requests_remaining is not None:
        out["anthropic-ratelimit-requests-limit"] = str(st.requests_limit)
        out["anthropic-ratelimit-requests-remaining"] = str(st.requests_remaining)
        out["anthropic-ratelimit-requests-reset"] = at(st.requests_reset)
    if st.tokens_limit is not None and st.tokens_remaining is not None:
        out["anthropic-ratelimit-tokens-limit"] = str(st.tokens_limit)
        out["anthropic-ratelimit-tokens-remaining"] = str(st.tokens_remaining)
        out["anthropic-ratelimit-tokens-reset"] = at(st.tokens_reset)
    return out
