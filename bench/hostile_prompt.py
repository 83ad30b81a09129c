"""Does another client's huge prompt stall a running stream? (issue 8, finding 3)

  python -m bench.hostile_prompt [--model PATH] [--repeat 3]

`corral serve` with the demo model (4 slots, n_ctx 4096, 2 threads). One client streams a
greedy completion and timestamps every token event. Meanwhile other clients send, one after
another, chat requests whose prompts cannot fit:

- 150 KB: under the byte bound, so it is really tokenized (on the preparing thread), then
  refused by its token count;
- 1 MB and 15 MB: over the byte bound, so they are refused from their length alone.

For each, it reports the time to the 400, and the stream's largest inter-token gap while
that request was in flight, against the stream's median gap (one decode step). The target
is a gap below 2 steps, and under 100 ms to the 400 for the 15 MB body. Before the fix, the
1 MB prompt froze the stream for 2.9 s and the 15 MB one took 21.7 s to be refused.

Results go to bench/results/hostile_prompt.json and bench/results/hostile_prompt.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.throughput import DEFAULT_MODEL, OUT, ROOT, free_port, wait_healthy

SIZES = (("150 KB", 150_000), ("1 MB", 1_000_000), ("15 MB", 15_000_000))
STREAM_TOKENS = 2000


def body(n_bytes: int) -> bytes:
    words = "the quick brown fox jumps over the lazy dog "
    content = (words * (n_bytes // len(words) + 1))[:n_bytes]
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()


class Stream:
    """A greedy stream, read in a process of its own, that timestamps every token event
    until stopped. Its own process: the client that sends 15 MB holds its interpreter for
    tens of milliseconds at a time, and a stream timed in the same process would show
    that as a gap the server never caused. time.monotonic() is one clock across
    processes."""

    def __init__(self, url: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._started = ctx.Event()
        self._out: multiprocessing.Queue[tuple[list[float], str | None]] = ctx.Queue()
        self._proc = ctx.Process(target=_stream, args=(url, self._stop, self._started, self._out), daemon=True)

    def start(self) -> None:
        self._proc.start()
        if not self._started.wait(120):
            raise RuntimeError("the stream did not start")

    def stop(self) -> list[float]:
        self._stop.set()
        times, error = self._out.get(timeout=60)
        self._proc.join(timeout=10)
        if error is not None:
            raise RuntimeError(f"the stream failed: {error}")
        return times


def _stream(url: str, stop: Any, started: Any, out: Any) -> None:
    req = {
        "model": "m", "prompt": "Once upon a time", "max_tokens": STREAM_TOKENS,
        "temperature": 0, "ignore_eos": True, "stream": True,
    }
    times: list[float] = []
    error = None
    try:
        with httpx.stream("POST", url + "/v1/completions", json=req, timeout=600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.monotonic())
                    if len(times) == 50:  # past the prompt, into steady decoding
                        started.set()
                if stop.is_set():
                    break  # closing the response cancels the generation
    except Exception as exc:  # reported by the parent
        error = repr(exc)
    out.put((times, error))


def max_gap(times: list[float], start: float, end: float) -> float:
    """The largest gap between consecutive events that ends inside [start, end + one gap]."""
    gaps = [b - a for a, b in zip(times, times[1:]) if start <= b and a <= end]
    return max(gaps, default=0.0)


def run_once(url: str) -> list[dict[str, float | str | int]]:
    bodies = [(label, body(n)) for label, n in SIZES]  # built before the stream starts
    stream = Stream(url)
    stream.start()
    client = httpx.Client(timeout=120)
    rows: list[dict[str, float | str | int]] = []
    for label, data in bodies:
        time.sleep(0.5)  # steady decoding between hostile requests
        t0 = time.monotonic()
        r = client.post(url + "/v1/chat/completions", content=data, headers={"content-type": "application/json"})
        t1 = time.monotonic()
        code = r.json()["error"]["code"]
        rows.append({"prompt": label, "status": r.status_code, "code": code, "to_400_ms": (t1 - t0) * 1000, "start": t0, "end": t1})
    time.sleep(0.5)
    times = stream.stop()
    client.close()
    step = statistics.median(b - a for a, b in zip(times, times[1:]))
    for row in rows:
        gap = max_gap(times, float(row["start"]), float(row["end"]))
        row.update(gap_ms=gap * 1000, median_step_ms=step * 1000, gap_in_steps=gap / step)
        del row["start"], row["end"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.toml"
        cfg.write_text(
            f'[server]\nport = {port}\nmax_body_bytes = 33554432\n[supervisor]\nidle_timeout = 0\n'
            f'[models.m]\npath = "{args.model}"\nslots = 4\nn_ctx = 4096\nthreads = 2\n'
            'chat_template = "gemma"\n'
        )
        log = open(Path(tmp) / "server.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "router.cli", "serve", "--config", str(cfg)],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url + "/health", proc)
            runs = [run_once(url) for _ in range(args.repeat)]
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    summary = []
    for i, (label, _) in enumerate(SIZES):
        rows = [run[i] for run in runs]
        summary.append({
            "prompt": label,
            "statuses": sorted({int(r["status"]) for r in rows}),
            "codes": sorted({str(r["code"]) for r in rows}),
            "to_400_ms_max": max(float(r["to_400_ms"]) for r in rows),
            "to_400_ms_median": statistics.median(float(r["to_400_ms"]) for r in rows),
            "gap_in_steps_max": max(float(r["gap_in_steps"]) for r in rows),
            "median_step_ms": statistics.median(float(r["median_step_ms"]) for r in rows),
        })
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "runs": runs,
        "summary": summary,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "hostile_prompt.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"Measured {result['date']} on {result['machine']}; {args.repeat} runs; demo model, 4 slots, "
        "n_ctx 4096, 2 threads. A greedy stream runs while another client sends each prompt.",
        "",
        "| prompt | answer | time to the 400 (median / max) | stream's largest gap meanwhile | median step |",
        "|---|---|---:|---:|---:|",
    ]
    for s in summary:
        lines.append(
            f"| {s['prompt']} | {'/'.join(map(str, s['statuses']))} {', '.join(s['codes'])} "
            f"| {s['to_400_ms_median']:.0f} / {s['to_400_ms_max']:.0f} ms "
            f"| {s['gap_in_steps_max']:.2f} steps | {s['median_step_ms']:.1f} ms |"
        )
    (OUT / "hostile_prompt.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
