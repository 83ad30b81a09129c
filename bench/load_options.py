"""KV cache types and flash attention: bytes a token and tokens a second, Corral against
llama-server with the same flags, one run (issue 43).

  python -m bench.load_options --llama-server PATH [--tokens 128] [--rounds 3]

For each KV type (f16, q8_0, q4_0) and flash attention on and off (a quantized V cache needs
it on: those pairs are skipped, as llama.cpp refuses them), both servers start with the
demo model and the same options (Corral's `cache_type_k`, `cache_type_v`, `flash_attn`;
llama-server's `-ctk`, `-ctv`, `-fa`), and run greedy completions at 1 and 4 streams, in
paired rounds (bench/throughput.py's bench_http: the order flips each round). Each server's
KV bytes a token are read from its own log: llama.cpp's "llama_kv_cache: size = ..." line in
llama-server's, the worker's "KV cache: ..." line (worker/model.py) in Corral's.

Results go to bench/results/load_options.json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from bench.charts import publish
from bench.throughput import DEFAULT_MODEL, OUT, SLOTS, bench_http, free_port, serve_corral, wait_healthy

N_CTX = 4096
SETTINGS = [(kv, fa) for kv in ("f16", "q8_0", "q4_0") for fa in ("on", "off") if kv == "f16" or fa == "on"]


@contextlib.contextmanager
def corral(model: Path, kv: str, fa: str) -> Iterator[tuple[str, Path]]:
    proc, port = serve_corral(model, extra=f'cache_type_k = "{kv}"\ncache_type_v = "{kv}"\nflash_attn = "{fa}"\n')
    try:
        yield f"http://127.0.0.1:{port}", Path(str(proc.args[-1])).parent / "server.log"  # type: ignore[index]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


@contextlib.contextmanager
def llama_server(binary: Path, model: Path, kv: str, fa: str) -> Iterator[tuple[str, Path]]:
    port = free_port()
    log_path = Path(tempfile.mkdtemp(prefix="llama-server-")) / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(binary), "-m", str(model), "--port", str(port), "-np", str(SLOTS), "-c", str(N_CTX), "-kvu", "-nr",
             "-t", str(os.cpu_count()), "--no-webui", "-fa", fa, "-ctk", kv, "-ctv", kv,
             # Corral's default swa_full (its sliding-window cache as large as n_ctx), and
             # the log level that prints llama.cpp's KV cache lines.
             "--swa-full", "-lv", "4"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}", log_path
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


_LLAMA = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells")
_CORRAL = re.compile(r"KV cache: (\d+) cells, K \S+ ([\d.]+) MiB, V \S+ ([\d.]+) MiB")


def kv_bytes_per_token(log: Path) -> float:
    """The KV caches' bytes a cell, summed over the caches one context logged (an iSWA
    model logs two)."""
    text = log.read_text(errors="replace")
    per_cell = [float(m[1]) * 2**20 / int(m[2]) for m in _LLAMA.finditer(text)]
    per_cell += [(float(m[2]) + float(m[3])) * 2**20 / int(m[1]) for m in _CORRAL.finditer(text)]
    if not per_cell:
        raise SystemExit(f"{log}: no KV cache size in the log")
    return sum(per_cell)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", type=Path, required=True)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    results: list[dict[str, Any]] = []
    for kv, fa in SETTINGS:
        print(f"cache {kv}, flash attention {fa}", flush=True)
        with corral(a.model, kv, fa) as (c_url, c_log), llama_server(a.llama_server, a.model, kv, fa) as (l_url, l_log):
            rates = bench_http({"corral": c_url + "/v1/completions", "llama-server": l_url + "/v1/completions"},
                               "demo", a.tokens, a.rounds, levels=(1, 4))
            results.append({
                "cache": kv, "flash_attn": fa,
                "kv_bytes_per_token": {"corral": kv_bytes_per_token(c_log), "llama-server": kv_bytes_per_token(l_log)},
                "tok_s": {name: {str(c): r for c, r in by_c.items()} for name, by_c in rates.items()},
            })
    doc = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "n_ctx": N_CTX,
           "tokens": a.tokens, "rounds": a.rounds, "results": results}
    lines = [
        f"KV cache types and flash attention, demo model, {N_CTX} cells, greedy completions of {a.tokens} tokens, "
        f"{a.rounds} paired rounds, {os.cpu_count()} CPU cores, {doc['date']}:",
        "",
        "| cache | flash attention | KV bytes a token, Corral / llama-server | 1 stream tok/s, Corral / llama-server "
        "| 4 streams tok/s, Corral / llama-server |",
        "|---|---|---:|---:|---:|",
    ]
    for r in results:
        kvb, t = r["kv_bytes_per_token"], r["tok_s"]

        def pair(c: str) -> str:
            mc, ml = statistics.median(t["corral"][c]), statistics.median(t["llama-server"][c])
            return f"{mc:.1f} / {ml:.1f} ({mc / ml:.2f}x)"

        lines.append(
            f"| {r['cache']} | {r['flash_attn']} | {kvb['corral']:,.0f} / {kvb['llama-server']:,.0f} | {pair('1')} | {pair('4')} |"
        )
    publish(OUT, "load_options", doc, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
