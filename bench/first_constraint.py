"""What a model's first constrained request costs the streams already running on it.

  python -m bench.first_constraint [--model PATH] [--rounds 2]

A model's first request with a JSON schema (or a grammar, or a forced tool call) makes the
worker build llguidance's view of the vocabulary: seconds on the demo model's 262k tokens,
about 2 s of it holding Python's GIL, which the engine thread needs between decode steps.
Each round starts a fresh `corral serve` with the demo model (a slot for each of 4 streams
and one more), runs 4 sampled streams on it, then sends its first constrained request.
Reported: how long that request took, and the longest gap between two chunks of any stream
while it ran, against the streams' median gap before (one decode step): issue 24 asks that
it delay none of them by more than one step's time. The vocabulary is built while the
model loads since then (worker/link.py); before, the first constrained request built it.

Results go to bench/results/first_constraint.json and bench/results/first_constraint.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.charts import write_chart
from bench.throughput import DEFAULT_MODEL, ROOT, free_port, wait_healthy

RESULTS = ROOT / "bench" / "results"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
STORY = [{"role": "user", "content": "Tell me a long story."}]


STREAMS = 4


def serve(model: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    # A slot for each stream and one for the constrained request, so that it waits for
    # none; token by token (spec_type none), so that a gap between chunks is a step.
    model_table = (
        f'[models.a]\npath = "{model}"\nslots = {STREAMS + 1}\nn_ctx = 8192\nchat_template = "gemma"\n'
        'spec_type = "none"\n'
    )
    (tmp / "config.toml").write_text(f"[server]\nport = {port}\n[supervisor]\nidle_timeout = 0\n{model_table}")
    log = (tmp / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", "--config", str(tmp / "config.toml")],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url + "/health", proc)
    return proc, url


def stream(url: str, model: str, times: list[float], stop: threading.Event) -> None:
    """A sampled chat stream that runs until `stop`; the arrival time of each chunk."""
    body = {"model": model, "messages": STORY, "max_tokens": 3000, "temperature": 1.0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                times.append(time.monotonic())
            if stop.is_set():
                return


def one_round(model: Path) -> dict[str, float]:
    proc, url = serve(model)
    try:
        r = httpx.post(url + "/v1/chat/completions", json={"model": "a", "messages": STORY, "max_tokens": 1}, timeout=120)
        r.raise_for_status()  # loaded, and warm, before anything is timed
        stop = threading.Event()
        times: list[list[float]] = [[] for _ in range(STREAMS)]
        threads = [threading.Thread(target=stream, args=(url, "a", times[i], stop)) for i in range(STREAMS)]
        for t in threads:
            t.start()
        time.sleep(4)
        t0 = time.monotonic()
        body = {
            "model": "a", "messages": STORY, "max_tokens": 5,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
        }
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        t1 = time.monotonic()
        r.raise_for_status()
        time.sleep(2)
        stop.set()
        for t in threads:
            t.join(60)
        before: list[float] = []
        worst = 0.0  # the longest gap of any stream while the constrained request ran
        for ts in times:
            gaps = list(zip(ts, ts[1:]))
            before += [b - a for a, b in gaps if b < t0]
            worst = max([worst] + [b - a for a, b in gaps if b > t0 and a < t1])
        step = statistics.median(before)
        return {
            "constrained_request_s": t1 - t0,
            "median_gap_before_s": step,
            "longest_gap_during_s": worst,
            # What the constrained request cost the streams beyond their own step.
            "extra_delay_in_steps": max(0.0, worst - step) / step,
        }
    finally:
        proc.terminate()
        proc.wait(60)


def report(rounds: list[dict[str, float]]) -> str:
    lines = [
        f"A model's first constrained request (a JSON schema) while {STREAMS} sampled streams run on it (a slot "
        "free for it), one fresh `corral serve` per round; a gap between two chunks of a stream is one decode step.",
        "",
        "| round | first constrained request | streams' median gap before | longest gap of any stream meanwhile | delay beyond a step, in steps |",
        "|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(rounds, 1):
        lines.append(
            f"| {i} | {r['constrained_request_s']:.2f} s | {r['median_gap_before_s'] * 1000:.0f} ms "
            f"| {r['longest_gap_during_s'] * 1000:.0f} ms | {r['extra_delay_in_steps']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.first_constraint")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rounds = []
    for i in range(args.rounds):
        rounds.append(one_round(args.model))
        print(f"round {i + 1}: {json.dumps({k: round(v, 3) for k, v in rounds[-1].items()})}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "rounds": rounds}
    (RESULTS / "first_constraint.json").write_text(json.dumps(out, indent=2) + "\n")
    (RESULTS / "first_constraint.md").write_text(report(rounds))
    write_chart(RESULTS / "first_constraint.json")
    print(report(rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
