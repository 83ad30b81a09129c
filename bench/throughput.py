"""Aggregate generation throughput: Corral over HTTP against llama-cpp-python's `Llama`.

  python -m bench.throughput [--model PATH] [--tokens 128] [--rounds 2]

Corral: `corral serve` with the demo model and 4 slots; for each concurrency C in 1, 2, 4
and 8, C greedy completions of exactly `--tokens` new tokens (ignore_eos) are sent at once,
`--rounds` times, through the HTTP endpoint. Aggregate tok/s = completion tokens / wall time.

With `--llama-server PATH`, llama.cpp's own server answers the same requests in the same
rounds: both servers are up, and each round takes them in turn, so that a slow spell on the
shared machine falls on both; the ratio reported is the median of the rounds' pairs.

Baseline: the same requests sent one at a time to the high-level `llama_cpp.Llama` in this
process, which is what a Python user would reach for today. It runs after Corral has
stopped, so the two never share the CPU.

The machine is shared and noisy, so the report leads with ratios measured in the same run.
Ceiling: `llama_decode` alone, one token per sequence per step with no sampling and no
server, for C sequences. It shows how far batching can scale on the machine at hand.

Results go to bench/results/throughput.json and bench/results/throughput.md.

  python -m bench.throughput --llama-server PATH --pairs 1,4 --rounds 10 --epochs 8

Only the paired rounds against llama-server, at the levels given, with a 95% bootstrap
interval for the median of the pairs' ratios and the count of rounds Corral won. Each of
`--epochs` starts both servers afresh: a pair of processes keeps a speed difference of up to
about 1.5% for its life even between two identical llama-servers (bench/intervals.py), so
only several starts tell "ahead" from "level". Results go to
bench/results/throughput-pairs.json and .md.

  python -m bench.throughput --structured [--tokens 128] [--rounds 2]

Structured output instead: one `corral serve`, and at 1 and 4 concurrent streams the same
greedy completions unconstrained and constrained by a JSON schema (`json_schema`), rounds
alternating so that both see the same machine. The schema asks for at least 20 objects, so
no constrained answer can end before `--tokens`. The report gives medians over rounds and the
median ratio of each round's pair, since one round can be slowed many times over by another
process on a shared machine. `--threads 1` gives the worker one decode thread, which such
interference hurts far less. Results go to bench/results/structured_throughput.json and .md.

n choices against separate requests (`--choices`, or `--choices-only` for this alone): one
`corral serve`, the same prompt shape (about 500 tokens, fresh each time so that no cache
helps), 4 choices asked for as n = 4 in one request or as 4 requests sent at once, taking
turns for `--rounds` rounds each. Reported: wall time and the prompt tokens the worker
decoded (its prompt_tokens_decoded, from /admin/models). Results go to
bench/results/choices.json and bench/results/choices.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

from bench.charts import write_chart
from bench.intervals import clustered_median_interval

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "models" / "gemma-3-270m-Q4_K_M.gguf"
OUT = ROOT / "bench" / "results"
CONCURRENCY = (1, 2, 4, 8)
SLOTS = 4


def prompt(i: int) -> str:
    # Distinct prompts, so no request is served from another's cached prefix.
    return f"Story number {i}. Once upon a time, in a village by the sea, there lived"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _completions(url: str, model: str, tokens: int) -> tuple[httpx.Client, Any]:
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=16))

    def one(i: int) -> int:
        r = client.post(url, json={
            "model": model, "prompt": prompt(i), "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True,
        })
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    one(10_000)  # load the model and warm up
    return client, one


def bench_http(
    targets: dict[str, str], model: str, tokens: int, rounds: int, levels: tuple[int, ...] = CONCURRENCY
) -> dict[str, dict[int, list[float]]]:
    """C greedy completions of `tokens` tokens at once, for each C, through each target's
    OpenAI-compatible /v1/completions. With several targets, every round takes them in
    turn (all are up, the idle ones cost nothing; the order flips each round), so that a
    slow spell on a shared machine falls on all of them alike. Returns each target's tok/s per C, round by round."""
    ones = {name: _completions(url, model, tokens)[1] for name, url in targets.items()}
    rates: dict[str, dict[int, list[float]]] = {name: {c: [] for c in levels} for name in targets}
    with concurrent.futures.ThreadPoolExecutor(max(levels)) as pool:
        for c in levels:
            for r in range(rounds):
                ids = range(r * 100 + c * 1000, r * 100 + c * 1000 + c)
                # Odd rounds take the targets in the other order: neither always goes first.
                for name, one in (list(ones.items()) if r % 2 == 0 else list(ones.items())[::-1]):
                    t0 = time.perf_counter()
                    total = sum(pool.map(one, ids))
                    wall = time.perf_counter() - t0
                    assert total == c * tokens, f"{name}: expected {c * tokens} tokens, got {total}"
                    rates[name][c].append(total / wall)
            print("  ".join(f"{name} c={c}: {statistics.median(rates[name][c]):6.1f} tok/s" for name in targets), flush=True)
    return rates


# Objects with a bounded string and a bounded integer, at least 20 of them: a realistic
# structured answer that cannot be complete within 128 tokens.
STRUCTURED_SCHEMA = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "minItems": 20,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                },
                "required": ["name", "age"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["people"],
    "additionalProperties": False,
}
STRUCTURED_CONCURRENCY = (1, 4)


def bench_structured_http(url: str, model: str, tokens: int, rounds: int) -> dict[int, dict[str, list[float]]]:
    """At each concurrency, rounds of C unconstrained then C constrained completions: the
    tok/s of each round, by concurrency and kind."""
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=16))

    def one(i: int, constrained: bool) -> int:
        body: dict[str, object] = {
            "model": model, "prompt": prompt(i), "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
        }
        if constrained:
            body["json_schema"] = STRUCTURED_SCHEMA
        r = client.post(url, json=body)
        r.raise_for_status()
        out = r.json()
        if constrained:  # the answer is the schema's prefix: it starts as the schema says
            assert out["choices"][0]["text"].startswith('{"people": [{"name": "'), out["choices"][0]["text"][:80]
        return int(out["usage"]["completion_tokens"])

    one(10_000, False)  # load the model
    one(10_001, True)  # build llguidance's tokenizer (once per model)
    kinds = ("unconstrained", "constrained")
    # Per round and kind, tok/s. The machine is shared: another process taking a core can
    # slow one round tenfold (two spinning decode threads wait on the descheduled one), so
    # the report takes medians, and the ratio of each round's adjacent pair.
    rates: dict[int, dict[str, list[float]]] = {}
    with concurrent.futures.ThreadPoolExecutor(max(STRUCTURED_CONCURRENCY)) as pool:
        for c in STRUCTURED_CONCURRENCY:
            rates[c] = {k: [] for k in kinds}
            for r in range(rounds):
                for kind in kinds:
                    ids = range(r * 100 + c * 1000, r * 100 + c * 1000 + c)
                    t0 = time.perf_counter()
                    n = sum(pool.map(lambda i: one(i, kind == "constrained"), ids))
                    wall = time.perf_counter() - t0
                    assert n == c * tokens, f"{kind}: expected {c * tokens} tokens, got {n}"
                    rates[c][kind].append(n / wall)
                    print(f"{kind:<14} c={c} round {r}: {n / wall:6.1f} tok/s", flush=True)
    return rates


def start_corral(config: str, prefix: str = "corral-bench-") -> tuple[subprocess.Popen[bytes], int]:
    """`corral serve` on `config` ({PORT} filled in with a free port), healthy; its process
    and port. Its config and log are in a temporary folder named by `prefix`."""
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    cfg = tmp / "config.toml"
    cfg.write_text(config.replace("{PORT}", str(port)))
    log = (tmp / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", "--config", str(cfg)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    wait_healthy(f"http://127.0.0.1:{port}/health", proc)
    return proc, port


def serve_corral(model: Path, threads: int | None = None, extra: str = "") -> tuple[subprocess.Popen[bytes], int]:
    return start_corral(
        '[server]\nport = {PORT}\n[supervisor]\nidle_timeout = 0\n'
        f'[models.demo]\npath = "{model}"\nslots = {SLOTS}\nn_ctx = 4096\n'
        # Decode speed token by token, as llama-server's (without --spec-type) is measured:
        # the greedy, ignore_eos texts here repeat themselves, and drafts would multiply
        # the figure (bench/speculative.py measures them).
        + 'spec_type = "none"\n'
        + (f"threads = {threads}\n" if threads else "")
        + extra
    )


def bench_structured(model: Path, tokens: int, rounds: int, threads: int | None) -> int:
    proc, port = serve_corral(model, threads)
    try:
        res = bench_structured_http(f"http://127.0.0.1:{port}/v1/completions", "demo", tokens, rounds)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    med = {c: {k: statistics.median(v) for k, v in res[c].items()} for c in STRUCTURED_CONCURRENCY}
    paired = {
        c: statistics.median(con / unc for unc, con in zip(res[c]["unconstrained"], res[c]["constrained"]))
        for c in STRUCTURED_CONCURRENCY
    }
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "tokens": tokens,
        "rounds": rounds,
        "slots": SLOTS,
        "threads": threads,
        "schema": STRUCTURED_SCHEMA,
        "rounds_tok_s": res,
        "median_tok_s": med,
        "constrained_vs_unconstrained_median_of_pairs": paired,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "structured_throughput.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        f"Greedy completions of {tokens} new tokens, {rounds} rounds per level, each an unconstrained "
        f"then a constrained batch of C requests, one Corral ({SLOTS} slots, {threads or 'default'} decode "
        f"threads), demo model, {os.cpu_count()} CPU cores; constrained = json_schema (objects with a "
        "bounded string and integer, at least 20 of them). Medians over rounds; the ratio is the median "
        "of each round's pair.",
        "",
        "| concurrent requests | unconstrained tok/s | constrained tok/s | constrained / unconstrained |",
        "|---:|---:|---:|---:|",
    ]
    for c in STRUCTURED_CONCURRENCY:
        lines.append(
            f"| {c} | {med[c]['unconstrained']:.1f} | {med[c]['constrained']:.1f} | {paired[c]:.2f}x |"
        )
    md = "\n".join(lines) + "\n"
    (OUT / "structured_throughput.md").write_text(md)
    write_chart(OUT / "structured_throughput.json")
    print(md)
    return 0


@contextlib.contextmanager
def corral_up(model: Path, extra: str = "") -> Iterator[str]:
    """A Corral serving the demo model (`extra`: more lines for its model table); yields its
    completions URL."""
    proc, port = serve_corral(model, extra=extra)
    try:
        yield f"http://127.0.0.1:{port}/v1/completions"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def long_prompt(tag: str) -> str:
    # About 500 tokens, and unique: a cached prefix would hide the prefill being measured.
    return f"Report {tag}. " + " ".join(f"Item {tag}-{i} is on shelf {i * 7 % 13}." for i in range(60))


def bench_choices(model: Path, tokens: int, rounds: int, n: int = 4) -> dict[str, object]:
    """n choices in one request against n requests with the same prompt, same server."""
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    cfg = tmp / "config.toml"
    cfg.write_text(
        f'[server]\nport = {port}\n[supervisor]\nidle_timeout = 0\nhealth_interval = 0.2\n'
        f'[models.demo]\npath = "{model}"\nslots = {n}\nn_ctx = 4096\n'
    )
    log = (tmp / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", "--config", str(cfg)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=16))

    def decoded() -> int:
        # Once two pings agree: the figure is settled between measurements.
        last = None
        while True:
            v = client.get(f"{base}/admin/models/demo").json()["model"]["prompt_tokens_decoded"]
            if v is not None and v == last:
                return int(v)
            last = v
            time.sleep(0.5)

    def ask(text: str, choices: int) -> tuple[int, int, int]:
        r = client.post(f"{base}/v1/completions", json={
            "model": "demo", "prompt": text, "max_tokens": tokens, "n": choices,
            "temperature": 0.8, "seed": 1, "ignore_eos": True,
        })
        r.raise_for_status()
        u = r.json()["usage"]
        cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return int(u["prompt_tokens"]), int(u["completion_tokens"]), cached

    out: dict[str, dict[str, float]] = {
        "one_request": {"seconds": 0.0, "decoded": 0, "completion": 0, "cached": 0, "prompt_tokens": 0},
        "separate": {"seconds": 0.0, "decoded": 0, "completion": 0, "cached": 0, "prompt_tokens": 0},
    }
    prompt_tokens = 0
    try:
        wait_healthy(f"{base}/health", proc)
        ask("warm up", 1)
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            for r in range(rounds):
                for kind in ("one_request", "separate") if r % 2 == 0 else ("separate", "one_request"):
                    # Tags of one shape: the two kinds' prompts tokenize to the same length.
                    text = long_prompt(f"{'AB'[kind == 'separate']}{r}")
                    before = decoded()
                    t0 = time.perf_counter()
                    if kind == "one_request":
                        got = [ask(text, n)]
                    else:
                        got = list(pool.map(lambda _: ask(text, 1), range(n)))
                    out[kind]["seconds"] += time.perf_counter() - t0
                    out[kind]["decoded"] += decoded() - before
                    out[kind]["completion"] += sum(c for _, c, _ in got)
                    out[kind]["cached"] += sum(c for _, _, c in got)
                    out[kind]["prompt_tokens"] += sum(p for p, _, _ in got)  # as the usage counts them
                    prompt_tokens = got[0][0]
                    print(f"choices {kind:<11} round {r}: {out[kind]}", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    one, sep = out["one_request"], out["separate"]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "choices": n, "tokens": tokens, "rounds": rounds, "prompt_tokens": prompt_tokens, **out,
        "time_ratio_separate_over_n": sep["seconds"] / one["seconds"],
        "decoded_ratio_separate_over_n": sep["decoded"] / max(one["decoded"], 1),
    }


def choices_report(res: dict[str, Any]) -> str:
    one, sep = res["one_request"], res["separate"]
    k = res["choices"]
    return "\n".join([
        f"{k} choices of {res['tokens']} sampled tokens (ignore_eos) for a prompt of "
        f"{res['prompt_tokens']} tokens, {res['rounds']} rounds each, taking turns; demo model, "
        f"{k} slots, {os.cpu_count()} CPU cores.",
        "",
        "| asked as | seconds | prompt tokens decoded | usage's prompt_tokens | usage's cached_tokens "
        "| completion tokens |",
        "|---|---:|---:|---:|---:|---:|",
        f"| one request, n = {k} | {one['seconds']:.2f} | {one['decoded']} | {one['prompt_tokens']} "
        f"| {one['cached']} | {one['completion']} |",
        f"| {k} requests at once | {sep['seconds']:.2f} | {sep['decoded']} | {sep['prompt_tokens']} "
        f"| {sep['cached']} | {sep['completion']} |",
        "",
        f"Separate / n: {res['time_ratio_separate_over_n']:.2f}x the time, "
        f"{res['decoded_ratio_separate_over_n']:.2f}x the prompt tokens decoded.",
    ]) + "\n"


@contextlib.contextmanager
def llama_server_up(binary: Path, model: Path) -> Iterator[str]:
    """llama.cpp's own server, configured as the notes measured it: 4 slots sharing a
    unified 4096-cell KV cache, no repacking, every core. Yields its completions URL."""
    with llama_server_at(binary, model) as url:
        yield url + "/v1/completions"


@contextlib.contextmanager
def llama_server_at(
    binary: Path, model: Path, extra: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """llama_server_up's server with `extra` arguments and environment; yields its base URL."""
    port = free_port()
    log = open(Path(tempfile.mkdtemp(prefix="llama-server-")) / "server.log", "wb")
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "--port", str(port), "-np", str(SLOTS), "-c", "4096",
         "-kvu", "-nr", "-t", str(os.cpu_count()), "--no-webui", *extra],
        stdout=log, stderr=subprocess.STDOUT, env=None if env is None else {**os.environ, **env},
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def bench_llama(model: Path, tokens: int, rounds: int) -> dict[int, float]:
    import llama_cpp
    import llama_cpp.llama_cpp as low

    # The AMX crash (ggml-org/llama.cpp#20824): without this, Llama segfaults on these CPUs
    # at the first multi-token decode. Llama(...) has no argument for it, so patch the
    # defaults it reads.
    original = low.llama_model_default_params

    def no_repack() -> low.llama_model_params:
        p = original()
        p.use_extra_bufts = False
        return p

    low.llama_model_default_params = no_repack  # type: ignore[assignment]
    llm = llama_cpp.Llama(str(model), n_ctx=4096, n_threads=os.cpu_count(), verbose=False)
    vocab = llm._model.vocab
    eog = [t for t in range(llm.n_vocab()) if low.llama_vocab_is_eog(vocab, t)]

    def ban_eog(_ids: object, scores: object) -> object:
        scores[eog] = -float("inf")  # type: ignore[index]
        return scores

    processors = llama_cpp.LogitsProcessorList([ban_eog])
    llm.create_completion(prompt(10_000), max_tokens=8, temperature=0)  # warm up
    results: dict[int, float] = {}
    for c in CONCURRENCY:
        total, wall = 0, 0.0
        for r in range(rounds):
            t0 = time.perf_counter()
            for i in range(c):  # one at a time: Llama serves a single sequence
                out = llm.create_completion(
                    prompt(r * 100 + c * 1000 + i), max_tokens=tokens, temperature=0,
                    logits_processor=processors,
                )
                total += int(out["usage"]["completion_tokens"])
            wall += time.perf_counter() - t0
        results[c] = total / wall
        print(f"Llama    c={c}: {results[c]:6.1f} tok/s", flush=True)
    return results


def bench_raw(model: Path, tokens: int) -> dict[int, float]:
    """The ceiling: llama_decode alone, one token per sequence per step, no sampling, no
    server. No engine can batch faster than this on the machine at hand."""
    import llama_cpp

    from worker.batch import BatchBuffer
    from worker.model import load
    from worker.protocol import WorkerSpec

    m = load(WorkerSpec(name="raw", path=str(model), slots=max(CONCURRENCY), n_ctx=4096), lambda p: None)
    batch = BatchBuffer(m.n_batch)
    results: dict[int, float] = {}
    for c in CONCURRENCY:
        llama_cpp.llama_memory_clear(m.memory, True)
        pos = [0] * c
        for s in range(c):
            toks = m.tokenize(prompt(s))
            batch.clear()
            batch.add(toks, 0, s, "last")
            assert llama_cpp.llama_decode(m.ctx, batch.struct()) == 0
            pos[s] = len(toks)
        t0 = time.perf_counter()
        for _ in range(tokens):
            batch.clear()
            for s in range(c):
                batch.add([1000], pos[s], s, "last")
                pos[s] += 1
            assert llama_cpp.llama_decode(m.ctx, batch.struct()) == 0
        results[c] = c * tokens / (time.perf_counter() - t0)
        print(f"raw      c={c}: {results[c]:6.1f} tok/s", flush=True)
    m.close()
    return results


def bench_pairs(
    binary: Path, model: Path, tokens: int, rounds: int, levels: tuple[int, ...], options: list[str], epochs: int = 1
) -> str:
    """Only the paired rounds against llama-server, at the given levels, many rounds, in
    `epochs` fresh starts of both servers (which one starts first alternates): the median
    of the pairs' ratios and its bootstrap interval over starts and rounds
    (bench/intervals.py says why one start is not enough)."""
    starts: list[dict[str, dict[int, list[float]]]] = []
    for e in range(epochs):
        servers = {
            "corral": corral_up(model, "".join(o + "\n" for o in options)),
            "llama-server": llama_server_up(binary, model),
        }
        with contextlib.ExitStack() as up:
            urls = {name: up.enter_context(servers[name]) for name in (list(servers) if e % 2 == 0 else list(servers)[::-1])}
            starts.append(bench_http({name: urls[name] for name in servers}, "demo", tokens, rounds, levels))
        if epochs > 1:
            print(f"start {e + 1} of {epochs} done", flush=True)
    rates = {name: {c: [r for s in starts for r in s[name][c]] for c in levels} for name in ("corral", "llama-server")}
    per_start = {
        c: [[a / b for a, b in zip(s["corral"][c], s["llama-server"][c])] for s in starts] for c in levels
    }
    lines = [
        f"Paired rounds, Corral against llama-server (`-np 4 -kvu -nr`), greedy completions of "
        f"{tokens} new tokens, {rounds} rounds per level (the order flips each round)"
        + (f" in each of {epochs} fresh starts of both servers" if epochs > 1 else "")
        + f", demo model, {os.cpu_count()} CPU cores, {time.strftime('%Y-%m-%d %H:%M')}"
        + (f", Corral's model table adding `{'`, `'.join(options)}`" if options else "") + ".",
        "",
        "| concurrent requests | Corral tok/s | llama-server tok/s | Corral / llama-server, median of pairs "
        "| 95% interval | rounds Corral ahead |" + (" each start's median |" if epochs > 1 else ""),
        "|---:|---:|---:|---:|---:|---:|" + ("---|" if epochs > 1 else ""),
    ]
    doc: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "tokens": tokens, "rounds": rounds, "epochs": epochs, "corral_options": options, "rates": rates,
        "ratios_per_start": per_start,
    }
    for c in levels:
        ratios = [r for group in per_start[c] for r in group]
        lo, hi = clustered_median_interval(per_start[c])
        ahead = sum(r > 1.0 for r in ratios)
        each = " " + ", ".join(f"{statistics.median(g):.3f}" for g in per_start[c]) + " |" if epochs > 1 else ""
        lines.append(
            f"| {c} | {statistics.median(rates['corral'][c]):.1f} | {statistics.median(rates['llama-server'][c]):.1f} "
            f"| {statistics.median(ratios):.3f}x | {lo:.3f}-{hi:.3f} | {ahead} of {len(ratios)} |{each}"
        )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "throughput-pairs.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = "\n".join(lines) + "\n"
    (OUT / "throughput-pairs.md").write_text(md)
    write_chart(OUT / "throughput-pairs.json")
    return md


def wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"{proc.args[0]} did not become healthy")


def report(
    corral: dict[int, float],
    llama: dict[int, float],
    raw: dict[int, float],
    tokens: int,
    rounds: int,
    server: dict[int, float] | None = None,
    paired: dict[int, float] | None = None,
) -> str:
    lines = [
        f"Greedy completions of {tokens} new tokens, {rounds} rounds per level, demo model "
        f"(gemma-3 270M Q4_K_M), Corral with {SLOTS} slots, {os.cpu_count()} CPU cores.",
        "",
        "| concurrent requests | Corral tok/s | Corral vs its 1 stream | Llama (sequential) tok/s "
        "| Corral / Llama | llama_decode alone tok/s | its vs 1 seq | Corral / llama_decode |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in CONCURRENCY:
        lines.append(
            f"| {c} | {corral[c]:.1f} | {corral[c] / corral[1]:.2f}x | {llama[c]:.1f} "
            f"| {corral[c] / llama[c]:.2f}x | {raw[c]:.1f} | {raw[c] / raw[1]:.2f}x "
            f"| {corral[c] / raw[c]:.0%} |"
        )
    if server is not None:
        lines += [
            "",
            "Same run, llama.cpp's own llama-server (`-np 4 -kvu -nr`), same requests, both servers "
            "up and every round taking them in turn (Corral's column above is from those rounds; "
            "tok/s are medians over rounds, the ratio the median of each round's pair):",
            "",
            "| concurrent requests | llama-server tok/s | its vs 1 stream | Corral / llama-server |",
            "|---:|---:|---:|---:|",
        ]
        assert paired is not None
        for c in CONCURRENCY:
            lines.append(
                f"| {c} | {server[c]:.1f} | {server[c] / server[1]:.2f}x | {paired[c]:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--llama-server", type=Path, default=None,
        help="a llama-server binary to measure the same way, for a same-machine reference",
    )
    ap.add_argument(
        "--pairs", type=str, default=None, metavar="C[,C...]",
        help="with --llama-server: only the paired rounds at these concurrencies, with a bootstrap interval",
    )
    ap.add_argument(
        "--corral-option", action="append", default=[], metavar="'KEY = VALUE'",
        help="--pairs: a line added to Corral's model table (an A/B of one setting), repeatable",
    )
    ap.add_argument(
        "--epochs", type=int, default=1,
        help="--pairs: start both servers afresh this many times, --rounds rounds each (bench/intervals.py)",
    )
    ap.add_argument("--structured", action="store_true", help="constrained vs unconstrained, in one Corral")
    ap.add_argument(
        "--threads", type=int, default=None,
        help="--structured: the worker's decode threads (1 keeps a shared machine's noise down)",
    )
    ap.add_argument("--choices", action="store_true", help="also compare n = 4 with 4 separate requests")
    ap.add_argument("--choices-only", action="store_true", help="only that comparison")
    ap.add_argument("--choice-tokens", type=int, default=32, help="tokens per choice in that comparison")
    args = ap.parse_args()
    if not args.model.is_file():
        raise SystemExit(f"model not found: {args.model} (run `make model`)")
    if args.pairs is not None:
        if args.llama_server is None:
            raise SystemExit("--pairs needs --llama-server")
        levels = tuple(int(c) for c in args.pairs.split(","))
        print(bench_pairs(args.llama_server, args.model.resolve(), args.tokens, args.rounds, levels, args.corral_option, max(1, args.epochs)))
        return 0
    if args.structured:
        return bench_structured(args.model.resolve(), args.tokens, args.rounds, args.threads)
    if args.choices or args.choices_only:
        res = bench_choices(args.model.resolve(), args.choice_tokens, args.rounds)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "choices.json").write_text(json.dumps(res, indent=2) + "\n")
        md = choices_report(res)
        (OUT / "choices.md").write_text(md)
        write_chart(OUT / "choices.json")
        print(md)
        if args.choices_only:
            return 0
    model = args.model.resolve()
    with contextlib.ExitStack() as up:
        targets = {"corral": up.enter_context(corral_up(model))}
        if args.llama_server is not None:
            targets["llama-server"] = up.enter_context(llama_server_up(args.llama_server, model))
        rates = bench_http(targets, "demo", args.tokens, args.rounds)
    # Both servers stopped first: these two run in this process.
    llama = bench_llama(model, args.tokens, args.rounds)
    raw = bench_raw(model, args.tokens)
    corral = {c: statistics.median(v) for c, v in rates["corral"].items()}
    server = paired = None
    if "llama-server" in rates:
        server = {c: statistics.median(v) for c, v in rates["llama-server"].items()}
        paired = {
            c: statistics.median(a / b for a, b in zip(rates["corral"][c], rates["llama-server"][c]))
            for c in CONCURRENCY
        }
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "tokens": args.tokens,
        "rounds": args.rounds,
        "slots": SLOTS,
        "corral_tok_s": corral,
        "llama_sequential_tok_s": llama,
        "corral_scaling_vs_1": {c: corral[c] / corral[1] for c in CONCURRENCY},
        "corral_vs_llama": {c: corral[c] / llama[c] for c in CONCURRENCY},
        "llama_decode_alone_tok_s": raw,
        "llama_decode_scaling_vs_1": {c: raw[c] / raw[1] for c in CONCURRENCY},
        "corral_vs_llama_decode": {c: corral[c] / raw[c] for c in CONCURRENCY},
    }
    if server is not None:
        doc["llama_server_tok_s"] = server
        doc["llama_server_scaling_vs_1"] = {c: server[c] / server[1] for c in CONCURRENCY}
        doc["corral_vs_llama_server_median_of_pairs"] = paired
        doc["rounds_tok_s"] = rates
    (OUT / "throughput.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = report(corral, llama, raw, args.tokens, args.rounds, server, paired)
    (OUT / "throughput.md").write_text(md)
    write_chart(OUT / "throughput.json")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
