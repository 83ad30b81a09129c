"""Rate-limit headers as OpenAI's and Anthropic's clients read them (router/usage/headers.py)."""

from __future__ import annotations

import time

from router.usage import headers
from router.usage.quotas import Standing


def test_go_durations_as_openai_sends_them() -> None:
    assert headers.go_duration(0.02) == "20ms"
    assert headers.go_duration(1) == "1s"
    assert headers.go_duration(1.5) == "1.5s"
    assert headers.go_duration(360) == "6m0s"
    assert headers.go_duration(3723) == "1h2m3s"


def test_each_family_carries_only_the_limits_a_key_has() -> None:
    st = Standing(requests_limit=30, requests_remaining=29, requests_reset=2.0)
    assert headers.openai(st) == {
        "x-ratelimit-limit-requests": "30", "x-ratelimit-remaining-requests": "29", "x-ratelimit-reset-requests": "2s",
    }
    a = headers.anthropic(Standing(tokens_limit=1000, tokens_remaining=10, tokens_reset=60.0), 1_795_000_000.0)
    assert a == {
        "anthropic-ratelimit-tokens-limit": "1000", "anthropic-ratelimit-tokens-remaining": "10",
        "anthropic-ratelimit-tokens-reset": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_795_000_000 + 60)),
    }
