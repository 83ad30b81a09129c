"""bench/agents.py's bookkeeping (issue 24): what a turn decoded, read from either server's
final chunk, and the figures the report leads with."""

from __future__ import annotations

from bench.agents import Turn, _usage, question, summary, system_prompt


def test_decoded_tokens_come_from_cached_tokens_or_llama_servers_timings() -> None:
    corral = {"usage": {"prompt_tokens": 1500, "completion_tokens": 16, "prompt_tokens_details": {"cached_tokens": 1480}}}
    assert _usage(corral) == (1500, 20)
    # llama-server's timings say what it evaluated; they win where present.
    llama = {"usage": {"prompt_tokens": 1500, "completion_tokens": 16}, "timings": {"prompt_n": 700, "cache_n": 800}}
    assert _usage(llama) == (1500, 700)
    assert _usage({"choices": []}) is None


def test_the_summary_keeps_first_and_later_turns_apart() -> None:
    turns = [Turn(u, t, ttft=10.0 if t == 0 else 1.0 + u, prompt_tokens=1000 + 50 * t, decoded=1000 if t == 0 else 50)
             for u in range(3) for t in range(3)]
    s = summary(turns, wall=42.0)
    assert s["first_turns"] == {"n": 3, "ttft_median_s": 10.0, "ttft_p95_s": 10.0}
    assert s["later_turns"]["n"] == 6 and s["later_turns"]["ttft_median_s"] == 2.0 and s["later_turns"]["ttft_p95_s"] == 3.0
    assert s["prompt_tokens_sent"] == 3 * (1000 + 1050 + 1100) and s["prompt_tokens_decoded"] == 3 * 1100
    assert abs(s["decoded_fraction"] - 3300 / 9450) < 1e-12 and s["wall_s"] == 42.0


def test_the_load_is_deterministic() -> None:
    assert system_prompt(780) == system_prompt(780) and len(system_prompt(780).split()) > 700
    assert question(1, 2) != question(2, 1)
