"""An interactive user beside a batch job: priorities against one first-come line, and
against llama-server (issue 44's acceptance).

  python -m bench.priorities [--llama-server PATH] [--seconds 120] [--batch 16]

A 4-slot demo model. A batch key keeps `--batch` long generations in flight (each asks for
`--batch-tokens` tokens, ignore_eos, and asks again as it ends); an interactive key sends a
short chat turn every `--every` seconds, streamed, and its time to first token is measured.
Three servers in turn, the same traffic each:

- Corral with the keys' classes (`priority = "interactive"` and `"batch"`): the interactive
  turn passes the batch requests waiting in the slot line, and, with every slot busy,
  parks the newest batch request (its cells kept) to start at once;
- Corral with one class (the same keys, no priority): first come, first served, fairly
  shared between the two keys;
- llama-server with `-np 4` (its line is first come, first served).

Each server's idle figure comes first: the interactive turns alone. Reported: the
interactive TTFT's p50 and p95, each against the same percentile idle, and the batch key's
tokens a second while the interactive key ran (its loss to the preemptions is Corral with
classes against Corral with one class). Targets: p95 at most 1.5x idle with classes; batch
tokens a second within 10% of one class. Results go to bench/results/priorities.json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

from bench.charts import publish
from bench.throughput import DEFAULT_MODEL, OUT, llama_server_at, start_corral

INTERACTIVE_KEY = "bench-interactive-key-0001"
BATCH_KEY = "bench-batch-key-0000001"


def corral_config(model: Path, classes: bool) -> str:
    hi = ', priority = "interactive"' if classes else ""
    lo = ', priority = "batch"' if classes else ""
    return (
        "[server]\nport = {PORT}\n"
        f'api_keys = [{{ key = "{INTERACTIVE_KEY}", name = "interactive"{hi} }}, '
        f'{{ key = "{BATCH_KEY}", name = "batch"{lo} }}]\n'
        "[supervisor]\nidle_timeout = 0\n"
        f'[models.demo]\npath = "{model}"\nchat_template = "gemma"\nslots = 4\nn_ctx = 8192\nspec_type = "none"\n'
    )


@contextlib.contextmanager
def corral(model: Path, classes: bool) -> Iterator[str]:
    proc, port = start_corral(corral_config(model, classes), prefix="corral-priorities-")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def turn(c: httpx.Client, url: str, i: int) -> float:
    """One interactive chat turn, streamed: seconds to its first content token."""
    body = {
        "model": "demo", "stream": True, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": f"Question {i}: name a colour of the sea, in one word."}],
    }
    t0 = time.perf_counter()
    with c.stream("POST", url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {INTERACTIVE_KEY}"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"' in line.replace(": ", ":") and '"content":""' not in line.replace(": ", ":"):
                return time.perf_counter() - t0
    raise RuntimeError("a turn ended with no content")


def batch_stream(url: str, i: int, tokens: int, stop: threading.Event, counted: list[int], window: Any) -> None:
    """Long completions one after another; tokens that arrive inside `window` are counted."""
    k = 0
    with httpx.Client(timeout=900) as c:
        while not stop.is_set():
            body = {
                "model": "demo", "prompt": f"Batch document {i}.{k}: a long report on the harbour,",
                "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            }
            k += 1
            try:
                with c.stream("POST", url + "/v1/completions", json=body, headers={"authorization": f"Bearer {BATCH_KEY}"}) as r:
                    for line in r.iter_lines():
                        if stop.is_set():
                            return
                        if line.startswith("data: {"):
                            now = time.perf_counter()
                            if window[0] <= now <= window[1]:
                                counted[i] += 1
            except httpx.HTTPError:
                if stop.is_set():  # the server is going away after the measurement
                    return
                raise


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def batch_load(url: str, n: int, tokens: int, stop: Any, window: Any, total: Any) -> None:
    """The batch key's streams, in a process of their own: in the measuring process their
    16 reader threads would hold its GIL while an interactive turn's first token waits to
    be stamped, and count that as the server's time."""
    counted = [0] * n
    local_stop = threading.Event()
    streams = [
        threading.Thread(target=batch_stream, args=(url, i, tokens, local_stop, counted, window), daemon=True)
        for i in range(n)
    ]
    for t in streams:
        t.start()
    stop.wait()
    local_stop.set()
    for t in streams:
        t.join(timeout=120)
    total.value = sum(counted)


def measure(url: str, a: argparse.Namespace) -> dict[str, Any]:
    with httpx.Client(timeout=900) as c:
        turn(c, url, -1)  # the model loaded, the template warm
        idle = []
        for i in range(a.idle_turns):
            idle.append(turn(c, url, 1000 + i))
            time.sleep(0.2)
        ctx = multiprocessing.get_context("spawn")
        stop = ctx.Event()
        window = ctx.Array("d", [float("inf"), float("inf")])  # perf_counter: one clock for both processes
        total = ctx.Value("q", 0)
        load = ctx.Process(target=batch_load, args=(url, a.batch, a.batch_tokens, stop, window, total))
        load.start()
        time.sleep(a.warmup)  # every batch stream has started, the line is full
        window[0] = time.perf_counter()
        window[1] = window[0] + a.seconds + 3600  # closed below
        busy: list[float] = []
        i = 0
        while time.perf_counter() < window[0] + a.seconds:
            started = time.perf_counter()
            busy.append(turn(c, url, i))
            i += 1
            time.sleep(max(0.0, a.every - (time.perf_counter() - started)))
        window[1] = time.perf_counter()
        elapsed = window[1] - window[0]
        stop.set()
        load.join(timeout=180)
        counted = [int(total.value)]
    idle_p50 = statistics.median(idle)
    return {
        "idle_ttft_s": idle, "busy_ttft_s": busy,
        "idle_p50_s": idle_p50, "idle_p95_s": pct(idle, 0.95),
        "p50_s": statistics.median(busy), "p95_s": pct(busy, 0.95),
        # Each percentile against the same percentile idle: like with like.
        "p50_over_idle": statistics.median(busy) / idle_p50, "p95_over_idle": pct(busy, 0.95) / pct(idle, 0.95),
        "batch_tokens": sum(counted), "batch_tok_s": sum(counted) / elapsed, "seconds": elapsed,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", type=Path, default=None)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--seconds", type=float, default=120.0, help="how long the interactive key sends, per server")
    ap.add_argument("--every", type=float, default=3.0, help="seconds between interactive turns")
    ap.add_argument("--batch", type=int, default=16, help="batch generations in flight")
    ap.add_argument("--batch-tokens", type=int, default=400)
    ap.add_argument("--idle-turns", type=int, default=30)
    ap.add_argument("--warmup", type=float, default=8.0)
    a = ap.parse_args()
    results: dict[str, Any] = {}
    for name, classes in (("corral (classes)", True), ("corral (one class)", False)):
        with corral(a.model, classes) as url:
            results[name] = measure(url, a)
            print(name, {k: v for k, v in results[name].items() if not k.endswith("ttft_s")}, flush=True)
    if a.llama_server is not None:
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(llama_server_at(a.llama_server, a.model, ["-c", "8192", "--api-key", INTERACTIVE_KEY, "--api-key", BATCH_KEY]))
            results["llama-server"] = measure(url, a)
    setup = {
        "slots": 4, "batch": a.batch, "batch_tokens": a.batch_tokens, "every_s": a.every, "seconds": a.seconds,
        "cpus": os.cpu_count(),
    }
    one = results["corral (one class)"]["batch_tok_s"]
    lines = [
        f"An interactive key's chat turns beside a batch key's {a.batch} long generations in flight, "
        f"4 slots, {os.cpu_count()} CPUs, one run:",
        "",
        "| server | idle TTFT p50 / p95 s | TTFT p50 s | TTFT p95 s | p50 / idle p50 | p95 / idle p95 | batch tok/s | batch against one class |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['idle_p50_s']:.3f} / {r['idle_p95_s']:.3f} | {r['p50_s']:.3f} | {r['p95_s']:.3f} | {r['p50_over_idle']:.2f} "
            f"| {r['p95_over_idle']:.2f} | {r['batch_tok_s']:.1f} | {r['batch_tok_s'] / one:.2f} |"
        )
    publish(OUT, "priorities", {"setup": setup, "results": results}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
