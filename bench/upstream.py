"""What a Corral front costs in front of a Corral back (issue 25): the latency it adds to a
request, and whether relayed streams keep the back's tokens per second.

  python -m bench.upstream [--requests 200] [--rounds 12] [--tokens 128] [--back-threads N]

One back (`corral serve`, the demo model, 2 slots) and one front whose model `demo` is an
upstream of that back, both on this machine. Every measurement is a pair taken back to
back, the order flipping each time, so that a slow spell on the shared machine falls on
both halves:

- added latency: a one-token greedy completion straight to the back, and the same through
  the front; the front's share is the pair's difference. Reported: the median and p99 of
  the differences, and each side's median and p99.
- streams: a streamed greedy completion of `--tokens` tokens (ignore_eos) each way; the
  ratio of the front's tokens per second (first byte to last) to the back's, per pair.

Results go to bench/results/upstream.json and bench/results/upstream.md (with
--back-threads N, upstream-back-threads-N.*).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.charts import write_chart
from bench.intervals import median_interval
from bench.throughput import DEFAULT_MODEL, OUT, start_corral


@contextmanager
def serving(config: str, name: str) -> Iterator[str]:
    proc, port = start_corral(config, prefix=f"corral-{name}-")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def back_config(model: Path, threads: int | None = None) -> str:
    return (
        '[server]\nport = {PORT}\n[supervisor]\nidle_timeout = 0\n'
        f'[models.demo]\npath = "{model}"\nslots = 2\nn_ctx = 2048\nspec_type = "none"\n'
        + (f"threads = {threads}\n" if threads else "")
    )


def front_config(back: str) -> str:
    return f'[server]\nport = {{PORT}}\n[models.demo]\nupstream = "{back}/v1"\n'


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_pairs(client: httpx.Client, back: str, front: str, n: int) -> tuple[list[float], list[float]]:
    def once(url: str, i: int) -> float:
        t0 = time.perf_counter()
        r = client.post(url + "/v1/completions", json={
            "model": "demo", "prompt": f"Item {i}:", "max_tokens": 1, "temperature": 0,
        })
        elapsed = time.perf_counter() - t0
        r.raise_for_status()
        return elapsed

    direct: list[float] = []
    relayed: list[float] = []
    for i in range(n):
        first, second = (back, front) if i % 2 == 0 else (front, back)
        a, b = once(first, i), once(second, i)
        d, f = (a, b) if first == back else (b, a)
        direct.append(d)
        relayed.append(f)
    return direct, relayed


def stream_rate(client: httpx.Client, url: str, i: int, tokens: int) -> float:
    body = {
        "model": "demo", "prompt": f"Story {i}. Once upon a time", "max_tokens": tokens,
        "temperature": 0, "ignore_eos": True, "stream": True,
    }
    events = 0
    first = last = 0.0
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                now = time.perf_counter()
                first = first or now
                last = now
                events += 1
    assert events >= tokens, events
    return (events - 1) / (last - first)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--requests", type=int, default=200, help="pairs of one-token requests")
    ap.add_argument("--rounds", type=int, default=12, help="pairs of streams")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument(
        "--back-threads", type=int, default=None,
        help="the back's decode threads (default: every core). 1 leaves the front a core of its own, as on "
        "its own host: on a 2-core machine the back's two decode threads otherwise hold both cores, and the "
        "front's CPU for each relayed token is taken from them",
    )
    args = ap.parse_args()
    if not args.model.is_file():
        raise SystemExit(f"model not found: {args.model} (run `make model`)")
    with serving(back_config(args.model.resolve(), args.back_threads), "back") as back, serving(front_config(back), "front") as front:
        client = httpx.Client(timeout=600)
        for url in (back, front):  # load the model; open the front's connection to the back
            stream_rate(client, url, 0, 8)
        direct, relayed = latency_pairs(client, back, front, args.requests)
        ratios: list[float] = []
        rates: dict[str, list[float]] = {"back": [], "front": []}
        for r in range(args.rounds):
            order = ("back", "front") if r % 2 == 0 else ("front", "back")
            for name in order:
                rates[name].append(stream_rate(client, back if name == "back" else front, r + 1, args.tokens))
            ratios.append(rates["front"][-1] / rates["back"][-1])
    added = [f - d for d, f in zip(direct, relayed)]
    lo, hi = median_interval(ratios)
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": {"cpus": os.cpu_count()},
        "back_threads": args.back_threads,
        "requests": args.requests, "rounds": args.rounds, "tokens": args.tokens,
        "direct_s": direct, "relayed_s": relayed, "stream_tok_s": rates, "stream_ratios": ratios,
    }
    ms = 1000.0
    threads_flag = f" --back-threads {args.back_threads}" if args.back_threads else ""
    md = "\n".join([
        f"A Corral front relaying to a Corral back on the same machine (demo model, {os.cpu_count()} CPU cores, "
        f"the back's decode threads: {args.back_threads or 'every core'}), "
        f"{time.strftime('%Y-%m-%d %H:%M')}: `python -m bench.upstream --requests {args.requests} "
        f"--rounds {args.rounds} --tokens {args.tokens}{threads_flag}`.",
        "",
        "| one-token completion | median | p99 |",
        "|---|---:|---:|",
        f"| straight to the back | {statistics.median(direct) * ms:.1f} ms | {percentile(direct, 0.99) * ms:.1f} ms |",
        f"| through the front | {statistics.median(relayed) * ms:.1f} ms | {percentile(relayed, 0.99) * ms:.1f} ms |",
        f"| added by the front (per pair) | {statistics.median(added) * ms:.2f} ms | {percentile(added, 0.99) * ms:.2f} ms |",
        "",
        f"Streams of {args.tokens} tokens: the back {statistics.median(rates['back']):.1f} tok/s, through the front "
        f"{statistics.median(rates['front']):.1f} tok/s; front / back, median of {args.rounds} pairs: "
        f"**{statistics.median(ratios):.3f}x** (95% interval {lo:.3f}-{hi:.3f}).",
        "",
    ])
    OUT.mkdir(parents=True, exist_ok=True)
    name = "upstream" + (f"-back-threads-{args.back_threads}" if args.back_threads else "")
    (OUT / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (OUT / f"{name}.md").write_text(md)
    write_chart(OUT / f"{name}.json")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
