"""Sampling parameters checked as the worker's samplers need them, whatever the dialect.

Each dialect builds `SamplingParams` from its own names (OpenAI's `max_tokens`, Ollama's
`options.num_predict`) and passes `name`, which turns a SamplingParams field into the
parameter the client sent, so that a 400 names what the client has to fix.
"""

from __future__ import annotations

from typing import Callable

import msgspec

from supervisor.errors import InvalidRequest
from worker.protocol import MAX_STOP_STRINGS, SAMPLING_RANGES, SamplingParams

Name = Callable[[str], str]


def _same(field: str) -> str:
    return field


def _range(name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:  # NaN fails this too
        raise InvalidRequest(
            f"Invalid '{name}': expected a value between {lo:g} and {hi:g}, got {value:g}.", name
        )


def check(p: SamplingParams, name: Name = _same, min_tokens: int = 1) -> None:
    """The samplers' ranges and the token limit (llama-server's /completion allows 0:
    prefill only)."""
    for field, (lo, hi) in SAMPLING_RANGES.items():
        _range(name(field), getattr(p, field), lo, hi)
    if p.repeat_penalty == 0.0:  # llama.cpp requires > 0; 1.0 disables it
        n = name("repeat_penalty")
        raise InvalidRequest(f"Invalid '{n}': must be > 0 (1.0 disables it).", n)
    if p.top_k < 0:
        n = name("top_k")
        raise InvalidRequest(f"Invalid '{n}': must be >= 0 (0 disables it).", n)
    if p.repeat_last_n < -1:
        n = name("repeat_last_n")
        raise InvalidRequest(f"Invalid '{n}': must be >= -1.", n)
    if p.max_tokens is not None and p.max_tokens < min_tokens:
        n = name("max_tokens")
        raise InvalidRequest(
            f"Invalid '{n}': integer below minimum value. Expected a value >= {min_tokens}, "
            f"but got {p.max_tokens} instead.",
            n,
        )


def check_stops(stops: list[str], param: str = "stop") -> None:
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"Invalid '{param}': at most {MAX_STOP_STRINGS} stop strings are allowed.", param)
    if any(not s for s in stops):
        raise InvalidRequest(f"Invalid '{param}': stop strings must not be empty.", param)


def capped(p: SamplingParams, *caps: int | None) -> SamplingParams:
    """`p` with its token limit cut to the lowest of `caps` (a model's max_tokens_limit, a
    key's max_tokens; None: no cap), as llama-server's -n cuts n_predict: a request that
    asks more, or asks no limit, generates up to the cap and ends with "length". Never a
    400: agent CLIs send a large max_tokens by default (Claude Code 32,000) and must keep
    working. Every dialect's name for the limit (max_tokens, max_completion_tokens,
    max_output_tokens, n_predict, num_predict) is `max_tokens` here."""
    given = [c for c in caps if c is not None]
    if not given:
        return p
    cap = min(given)
    if p.max_tokens is not None and p.max_tokens <= cap:
        return p
    return msgspec.structs.replace(p, max_tokens=cap)
