"""llama-server's `timings` object, which its OpenAI routes and its own carry alike (and so
do Corral's, when a request asks with timings_per_token)."""

from __future__ import annotations

from worker.protocol import Timings


def timings_json(t: Timings | None) -> dict[str, float | int]:
    """llama-server's `timings`: the worker's counts and times, and the rates they give."""
    if t is None:
        t = Timings(prompt_n=0, prompt_ms=0.0, predicted_n=0, predicted_ms=0.0)
    return {
        "cache_n": t.cache_n,
        "prompt_n": t.prompt_n,
        "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": t.prompt_ms / t.prompt_n if t.prompt_n else 0.0,
        "prompt_per_second": 1000.0 * t.prompt_n / t.prompt_ms if t.prompt_ms > 0 else 0.0,
        "predicted_n": t.predicted_n,
        "predicted_ms": t.predicted_ms,
        "predicted_per_token_ms": t.predicted_ms / t.predicted_n if t.predicted_n else 0.0,
        "predicted_per_second": 1000.0 * t.predicted_n / t.predicted_ms if t.predicted_ms > 0 else 0.0,
    }
