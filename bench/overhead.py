"""What the request path's bookkeeping costs: this tree against an older one, same run.

  python -m bench.overhead [--baseline REF] [--rounds 6]

Issue 11 added work to every request: the key check, the slot line, the access log line,
request ids and the request metrics (counters and histograms fed as each request ends).
This benchmark serves the demo model twice, from this tree and from a git worktree of
`--baseline` (by default the last commit before that work), and sends both the same load,
round after round in turn, so that both see the same machine:

- `long`: 4 concurrent greedy completions of 128 tokens (throughput, as bench.throughput);
- `short`: 8 concurrent completions of 4 tokens, 4 times over (many requests a second, where
  per-request costs would show).

Reported: the median over rounds of this tree's tokens per second divided by the
baseline's in the same round. Target: at least 0.98. Results go to
bench/results/overhead.json and .md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
import httpx

from bench.charts import publish
from bench.throughput import DEFAULT_MODEL, OUT, ROOT, free_port, prompt, wait_healthy

BASELINE = "27e4582"  # issue 10's last commit: before keys, the slot line, logs and metrics
SHAPES = {"long": (4, 128, 1), "short": (8, 4, 4)}  # concurrency, tokens, batches per round


def serve(tree: Path, model: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cfg = tmp / f"config-{port}.toml"
    cfg.write_text(
        f'[server]\nport = {port}\n[supervisor]\nidle_timeout = 0\n'
        f'[models.demo]\npath = "{model}"\nslots = 4\nn_ctx = 4096\nthreads = 2\n'
    )
    log = (tmp / f"server-{port}.log").open("wb")
    # `-m` puts the working folder first on sys.path: each server (and its worker, which
    # inherits the folder) runs its own tree's code.
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", "--config", str(cfg)],
        cwd=tree, stdout=log, stderr=subprocess.STDOUT,
    )
    wait_healthy(f"http://127.0.0.1:{port}/health", proc)
    return proc, f"http://127.0.0.1:{port}/v1/completions"


def round_of(url: str, pool: concurrent.futures.ThreadPoolExecutor, client: httpx.Client, shape: str, seed: int) -> float:
    c, tokens, batches = SHAPES[shape]

    def one(i: int) -> int:
        r = client.post(url, json={
            "model": "demo", "prompt": prompt(i), "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
        })
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    t0 = time.perf_counter()
    n = 0
    for b in range(batches):
        n += sum(pool.map(one, range(seed + b * 100, seed + b * 100 + c)))
    wall = time.perf_counter() - t0
    assert n == c * tokens * batches
    return n / wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default=BASELINE)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="corral-overhead-"))
    base_tree = tmp / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.baseline], cwd=ROOT, check=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        now_proc, now_url = serve(ROOT, args.model.resolve(), tmp)
        procs.append(now_proc)
        base_proc, base_url = serve(base_tree, args.model.resolve(), tmp)
        procs.append(base_proc)
        client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=16))
        rates: dict[str, dict[str, list[float]]] = {s: {"now": [], "baseline": []} for s in SHAPES}
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for url in (now_url, base_url):  # load and warm both
                round_of(url, pool, client, "short", 90_000)
            for r in range(args.rounds):
                for shape in SHAPES:
                    # Alternate which goes first, so neither always follows the other.
                    order: list[tuple[str, str]] = [("now", now_url), ("baseline", base_url)]
                    if r % 2:
                        order.reverse()
                    for who, url in order:
                        rate = round_of(url, pool, client, shape, r * 1000 + (0 if who == "now" else 500))
                        rates[shape][who].append(rate)
                        print(f"{shape:<5} round {r} {who:<8} {rate:6.1f} tok/s", flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "baseline": args.baseline,
        "head": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "shapes": {s: {"concurrency": c, "tokens": t, "batches": b} for s, (c, t, b) in SHAPES.items()},
        "rates": rates,
        "ratio_median": {s: statistics.median(n / b for n, b in zip(v["now"], v["baseline"])) for s, v in rates.items()},
    }
    lines = [
        f"# Request-path overhead: {result['head']} against {args.baseline}, same run",
        "",
        "| load | this tree tok/s (median) | baseline tok/s (median) | ratio (median of rounds) |",
        "|---|---|---|---|",
    ]
    for s, v in rates.items():
        lines.append(
            f"| {s} ({SHAPES[s][0]} × {SHAPES[s][1]} tokens × {SHAPES[s][2]}) | {statistics.median(v['now']):.1f} "
            f"| {statistics.median(v['baseline']):.1f} | {result['ratio_median'][s]:.3f} |"
        )
    publish(OUT, "overhead", result, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
