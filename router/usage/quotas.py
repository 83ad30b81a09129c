"""Each key's quotas, counted and decided. Pure: the caller passes both clocks.

A request is admitted while each of its key's counts is under its limit, and counted as
it starts (a request, one more in flight); its tokens (prompt and generated) are charged
when its answer is done, as OpenAI charges a TPM limit and LiteLLM's proxy counts: Corral
cannot know a stream's tokens before it ends. So a key may end a minute past its token
limit by what its requests in flight then generate; `max_in_flight` bounds that.

- requests and tokens per minute: a sliding 60-second window (exact, and explainable: "30
  requests began in the last minute");
- tokens per day: since 00:00 UTC, seeded from the ledger at start, so a restart does not
  hand a key a fresh day;
- in flight: requests begun and not yet done.

A refusal says which limit, when the key may expect to pass it (Retry-After), and every
figure the rate-limit headers carry (router/usage/headers.py). State is kept by the key's
owner (its digest), so a reload that changes a key's limits keeps its counts, and a
different key at the same place in the config starts from zero.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from router.usage.entries import DAY, day_of
from supervisor.config.key_rules import KeyRules

WINDOW = 60.0


@dataclass
class _Use:
    starts: deque[float] = field(default_factory=deque)  # monotonic times of request starts
    spent: deque[tuple[float, int]] = field(default_factory=deque)  # (monotonic, tokens) charged
    minute_tokens: int = 0  # the sum of `spent`
    in_flight: int = 0
    day: int = 0  # the UTC day (epoch seconds of its start) day_tokens counts
    day_tokens: int = 0

    def forget(self, now: float) -> None:
        cutoff = now - WINDOW
        while self.starts and self.starts[0] <= cutoff:
            self.starts.popleft()
        while self.spent and self.spent[0][0] <= cutoff:
            self.minute_tokens -= self.spent.popleft()[1]

    def today(self, wall: float) -> int:
        if day_of(wall) != self.day:
            self.day, self.day_tokens = day_of(wall), 0
        return self.day_tokens


@dataclass(frozen=True)
class Standing:
    """A key's figures against its limits, for the rate-limit headers: None where it has
    no such limit. `reset_*` are seconds until the count is back under (or at 0 for
    tokens: until the window holds none of what it holds now)."""

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset: float = 0.0
    tokens_limit: int | None = None  # the tighter of tokens_per_minute and tokens_per_day
    tokens_remaining: int | None = None
    tokens_reset: float = 0.0


@dataclass(frozen=True)
class Refusal:
    limit: str  # the rule's name: "tokens_per_minute"
    retry_after: float  # seconds
    message: str
    standing: Standing


class QuotaBook:
    def __init__(self) -> None:
        self._use: dict[str, _Use] = {}

    def seed_day(self, tokens: dict[str, int], wall: float) -> None:
        """Today's tokens of each key (by the first 16 digits of its owner, as the ledger
        keeps it), read from the ledger at start."""
        for short, n in tokens.items():
            use = self._use.setdefault(short, _Use())
            use.today(wall)
            use.day_tokens += n

    def admit(self, owner: str, rules: KeyRules, now: float, wall: float) -> Refusal | None:
        """Count a request of `owner`'s as begun, or say why it may not begin."""
        use = self._of(owner)
        use.forget(now)
        refusal = self._refusal(use, rules, now, wall)
        if refusal is None:
            use.starts.append(now)
            use.in_flight += 1
        return refusal

    def done(self, owner: str, tokens: int, now: float, wall: float) -> None:
        """A request admitted by `admit` has ended, having used `tokens`."""
        use = self._of(owner)
        use.in_flight = max(0, use.in_flight - 1)
        if tokens > 0:
            use.spent.append((now, tokens))
            use.minute_tokens += tokens
            use.today(wall)
            use.day_tokens += tokens

    def standing(self, owner: str, rules: KeyRules, now: float, wall: float) -> Standing:
        use = self._of(owner)
        use.forget(now)
        return _standing(use, rules, now, wall)

    def in_flight(self, owner: str) -> int:
        return self._of(owner).in_flight

    def tokens_today(self, owner: str, wall: float) -> int:
        return self._of(owner).today(wall)

    def _of(self, owner: str) -> _Use:
        # By the digest's first 16 hex digits: the ledger's key_id, which seed_day uses.
        return self._use.setdefault(owner[:16], _Use())

    def _refusal(self, use: _Use, rules: KeyRules, now: float, wall: float) -> Refusal | None:
        standing = _standing(use, rules, now, wall)
        if rules.max_in_flight is not None and use.in_flight >= rules.max_in_flight:
            return Refusal(
                "max_in_flight", 1.0,
                f"this key already has {use.in_flight} request(s) in flight, its limit (max_in_flight = "
                f"{rules.max_in_flight}); retry when one is done",
                standing,
            )
        if rules.requests_per_minute is not None and len(use.starts) >= rules.requests_per_minute:
            # The start that must leave the window for one more to fit.
            wait = use.starts[len(use.starts) - rules.requests_per_minute] + WINDOW - now
            return Refusal(
                "requests_per_minute", wait,
                f"this key's rate limit of {rules.requests_per_minute} requests per minute is reached "
                f"(requests_per_minute); retry in {_words(wait)}",
                standing,
            )
        if rules.tokens_per_minute is not None and use.minute_tokens >= rules.tokens_per_minute:
            wait = _tokens_wait(use, rules.tokens_per_minute, now)
            return Refusal(
                "tokens_per_minute", wait,
                f"this key used {use.minute_tokens} tokens in the last minute, its limit of "
                f"{rules.tokens_per_minute} (tokens_per_minute); retry in {_words(wait)}",
                standing,
            )
        if rules.tokens_per_day is not None and use.today(wall) >= rules.tokens_per_day:
            wait = day_of(wall) + DAY - wall
            return Refusal(
                "tokens_per_day", wait,
                f"this key used {use.day_tokens} tokens today (UTC), its limit of {rules.tokens_per_day} "
                f"(tokens_per_day); the count starts again at 00:00 UTC, in {_words(wait)}",
                standing,
            )
        return None


def _tokens_wait(use: _Use, limit: int, now: float) -> float:
    """Seconds until the window's tokens are under `limit`."""
    over = use.minute_tokens - limit + 1
    for at, n in use.spent:
        over -= n
        if over <= 0:
            return at + WINDOW - now
    return WINDOW


def _standing(use: _Use, rules: KeyRules, now: float, wall: float) -> Standing:
    req_limit = rules.requests_per_minute
    req_reset = (use.starts[0] + WINDOW - now) if use.starts else 0.0
    tokens: list[tuple[int, int, float]] = []  # (remaining, limit, reset)
    if rules.tokens_per_minute is not None:
        reset = (use.spent[-1][0] + WINDOW - now) if use.spent else 0.0
        tokens.append((rules.tokens_per_minute - use.minute_tokens, rules.tokens_per_minute, reset))
    if rules.tokens_per_day is not None:
        tokens.append((rules.tokens_per_day - use.today(wall), rules.tokens_per_day, day_of(wall) + DAY - wall))
    tight = min(tokens) if tokens else None
    return Standing(
        requests_limit=req_limit,
        requests_remaining=None if req_limit is None else max(0, req_limit - len(use.starts)),
        requests_reset=max(0.0, req_reset),
        tokens_limit=None if tight is None else tight[1],
        tokens_remaining=None if tight is None else max(0, tight[0]),
        tokens_reset=0.0 if tight is None else max(0.0, tight[2]),
    )


def _words(seconds: float) -> str:
    s = max(1, math.ceil(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{math.ceil(s / 60)} min"
    return f"{s / 3600:.1f} h"
