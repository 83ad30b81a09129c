"""LoRA adapters under load: tokens a second with 4 streams on one adapter, on two, and on
the base model beside two, Corral against llama-server with the same adapters (issue 45).

  python -m bench.lora --llama-server PATH [--tokens 128] [--rounds 8] [--epochs 2]

Two random-weight adapters for the demo model, A and B (bench/lora_adapter.py, seeds 1 and
2), are loaded by both servers at scale 0: Corral's model table lists them
(`lora = [{ path, scale = 0.0 }, ...]`, 4 slots), llama-server gets `--lora-scaled
A:0.0,B:0.0` (`-np 4 -kvu`, bench/throughput.py's llama_server_at). Every request is a
greedy /completion of exactly `--tokens` tokens (ignore_eos) on a prompt of its own, and
picks its adapter with llama-server's per-request field, naming every adapter's scale:
`lora: [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]` for A, the reverse for B, both
at 0 for the base model. Four requests at once, in four scenarios:

- base: all 4 on the base model, the reference (one set, full batches);
- one adapter: all 4 on A (one set: what applying an adapter costs);
- two adapters: 2 on A, 2 on B;
- base + two adapters: 2 on the base model, 1 on A, 1 on B.

Neither server batches requests of different sets in one decode step (llama.cpp applies
a context's adapters to the whole batch): Corral gives the sets steps in turns weighted by
their requests (worker/adapter_turns.py), llama-server batches the slots whose adapters
equal its first busy slot's, so a mixed load costs both. Reported per scenario: aggregate
generated tokens a second (all 4 streams' tokens / the wall time of the four), the
Corral / llama-server ratio as the median of paired rounds (both servers up, taking turns,
the order flipping, so a slow spell of the shared machine falls on both) with its 95%
bootstrap interval over starts and rounds (bench/intervals.py), each server's speed
against its own base-only figure of the same round (what mixing sets costs it), and the
median time at which the first and the last of the four streams ended (how the server
shares the steps between sets). Corral's count of adapter-set switches is an engine
counter (worker/adapters.py) that no endpoint reports, so it is not measured here.

Before measuring, each server answers one prompt alone under the base model, A and B: the
three texts must differ (an adapter that is not applied would make this measure nothing),
and whether the servers' texts agree set by set is recorded.

Results go to bench/results/lora.json, .md and .png (`--out` elsewhere, e.g. for a trial
run: bench/results/ holds only the published runs, each shown in docs/).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import platform
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

from bench import lora_adapter
from bench.charts import publish
from bench.intervals import clustered_median_interval
from bench.throughput import DEFAULT_MODEL, OUT, SLOTS, llama_server_at, prompt, serve_corral
from worker.protocol.load_options import LORA_TURN_STEPS

SERVERS = ("corral", "llama-server")
STREAMS = 4
SEEDS = {"A": 1, "B": 2}  # adapter ids 0 and 1, in this order on both servers
RANK = 8
# Each scenario: the adapter of each of the 4 streams (None: the base model).
SCENARIOS: dict[str, tuple[str | None, ...]] = {
    "base": (None, None, None, None),
    "one adapter": ("A", "A", "A", "A"),
    "two adapters": ("A", "A", "B", "B"),
    "base + two adapters": (None, None, "A", "B"),
}
BASE_SCENARIO = "base"
CHECK_TOKENS = 16


def lora_field(adapter: str | None) -> list[dict[str, Any]]:
    """llama-server's per-request `lora` for `adapter` (None: the base model): every
    adapter's scale, 1 for the one asked for and 0 for the others. (Both servers set an
    adapter the field leaves out to 0; the base model's all-zero list is spelled out, since
    a request with no field gets the server's default scales.)"""
    return [{"id": i, "scale": 1.0 if name == adapter else 0.0} for i, name in enumerate(SEEDS)]


def make_adapters(model: Path, folder: Path) -> dict[str, Path]:
    out = {}
    for name, seed in SEEDS.items():
        out[name] = folder / f"lora-{name.lower()}.gguf"
        lora_adapter.write(model, out[name], seed=seed, rank=RANK)
    return out


@contextlib.contextmanager
def corral(model: Path, adapters: dict[str, Path], turn_steps: int | None = None) -> Iterator[str]:
    """Corral's demo model with the adapters loaded at scale 0 (and `lora_turn_steps`,
    where given); yields its base URL."""
    table = ", ".join(f'{{ path = "{p}", scale = 0.0 }}' for p in adapters.values())
    turns = "" if turn_steps is None else f"lora_turn_steps = {turn_steps}\n"
    proc, port = serve_corral(model, extra=f"lora = [{table}]\n{turns}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def llama_server(binary: Path, model: Path, adapters: dict[str, Path]) -> contextlib.AbstractContextManager[str]:
    """llama-server with the adapters at scale 0 by default, as Corral's table has them.
    (`--lora` with `--lora-init-without-apply` would not do: its /lora-adapters still says
    scale 1, and a request with no `lora` decodes under both adapters at 1.)"""
    return llama_server_at(binary, model, ["--lora-scaled", ",".join(f"{p}:0.0" for p in adapters.values())])


def complete(client: httpx.Client, url: str, text: str, tokens: int, adapter: str | None) -> dict[str, Any]:
    body = {"prompt": text, "n_predict": tokens, "temperature": 0, "ignore_eos": True, "lora": lora_field(adapter)}
    r = client.post(url + "/completion", json=body)
    if r.status_code != 200:
        raise SystemExit(f"{url}/completion answered {r.status_code} to {body}: {r.text[:500]}")
    out: dict[str, Any] = r.json()
    return out


def check(client: httpx.Client, url: str) -> dict[str, str]:
    """One prompt alone under each set: the texts, which must all differ."""
    texts = {a or "base": complete(client, url, prompt(-1), CHECK_TOKENS, a)["content"] for a in (None, *SEEDS)}
    if len(set(texts.values())) != len(texts):
        raise SystemExit(f"{url}: the adapters change nothing, the texts under base, A and B: {texts}")
    return texts


def one_load(
    pool: concurrent.futures.ThreadPoolExecutor, client: httpx.Client, url: str, sets: tuple[str | None, ...],
    tokens: int, first_id: int,
) -> dict[str, Any]:
    """The scenario's 4 requests at once: tok/s over the wall time of all, and when each ended."""
    t0 = time.perf_counter()

    def one(k: int) -> tuple[int, float]:
        out = complete(client, url, prompt(first_id + k), tokens, sets[k])
        return int(out["tokens_predicted"]), time.perf_counter() - t0

    done = list(pool.map(one, range(len(sets))))
    wall = time.perf_counter() - t0
    total = sum(n for n, _ in done)
    if total != tokens * len(sets):
        raise SystemExit(f"{url}: expected {tokens * len(sets)} tokens, got {[n for n, _ in done]}")
    return {"tok_s": total / wall, "ended_s": [t for _, t in done]}


def measure(urls: dict[str, str], tokens: int, rounds: int, epoch: int) -> dict[str, Any]:
    """`rounds` rounds; in each, every scenario on both servers in turn (the order flipping
    by round and scenario). Returns, by server and scenario, the rounds' results."""
    res: dict[str, Any] = {s: {name: [] for name in SCENARIOS} for s in urls}
    with httpx.Client(timeout=900, limits=httpx.Limits(max_connections=16)) as client, \
            concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        for r in range(rounds):
            for si, (name, sets) in enumerate(SCENARIOS.items()):
                order = list(urls) if (r + si + epoch) % 2 == 0 else list(urls)[::-1]
                first_id = 100_000 * (epoch + 1) + 1000 * r + 10 * si  # distinct prompts everywhere
                for s in order:
                    res[s][name].append(one_load(pool, client, urls[s], sets, tokens, first_id))
            print(f"  round {r + 1}: " + "  ".join(
                f"{name}: " + " / ".join(f"{res[s][name][-1]['tok_s']:.1f}" for s in urls) for name in SCENARIOS
            ) + "  (tok/s, " + " / ".join(urls) + ")", flush=True)
    return res


def summarize(starts: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scenario: each server's tok/s by round, the paired ratios by start, and medians."""
    out: dict[str, Any] = {}
    for name in SCENARIOS:
        rows = {s: [x for st in starts for x in st[s][name]] for s in SERVERS}
        base_rows = {s: [x for st in starts for x in st[s][BASE_SCENARIO]] for s in SERVERS}
        per_start = [[a["tok_s"] / b["tok_s"] for a, b in zip(st["corral"][name], st["llama-server"][name])]
                     for st in starts]
        pooled = [x for g in per_start for x in g]
        lo, hi = clustered_median_interval(per_start)
        out[name] = {
            "sets": [a or "base" for a in SCENARIOS[name]],
            "tok_s": {s: [x["tok_s"] for x in rows[s]] for s in SERVERS},
            "median_tok_s": {s: statistics.median(x["tok_s"] for x in rows[s]) for s in SERVERS},
            "ratios_per_start": per_start,
            "ratio_median": statistics.median(pooled),
            "ratio_interval": [lo, hi],
            "corral_ahead": sum(x > 1.0 for x in pooled),
            "rounds": len(pooled),
            # Against the same server's base-only load of the same round: what mixing costs it.
            "vs_base": {s: statistics.median(a["tok_s"] / b["tok_s"] for a, b in zip(rows[s], base_rows[s]))
                        for s in SERVERS},
            "first_ended_s": {s: statistics.median(min(x["ended_s"]) for x in rows[s]) for s in SERVERS},
            "last_ended_s": {s: statistics.median(max(x["ended_s"]) for x in rows[s]) for s in SERVERS},
        }
    return out


def table(doc: dict[str, Any]) -> list[str]:
    res = doc["results"]
    lines = [
        f"4 greedy /completion streams of {doc['tokens']} tokens at once, each on its adapter by llama-server's "
        f"per-request `lora` (two random-weight rank-{doc['rank']} adapters, A and B, loaded at scale 0 by both "
        f"servers), demo model, Corral with {SLOTS} slots against llama-server `-np 4 -kvu`, {doc['rounds']} paired "
        f"rounds" + (f" in each of {doc['epochs']} fresh starts of both servers" if doc["epochs"] > 1 else "")
        + f", {doc['machine']['cpus']} CPU cores, {doc['date'][:16]}. Tokens a second are medians over rounds; "
        "the ratio is the median of each round's pair.",
        "",
        "| scenario | streams | Corral tok/s | llama-server tok/s | Corral / llama-server | 95% interval "
        "| rounds Corral ahead | Corral vs its base | llama-server vs its base | first / last stream done, s: Corral "
        "| llama-server |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in res.items():
        sets = ", ".join(f"{r['sets'].count(a)} {a}" for a in dict.fromkeys(r["sets"]))
        lo, hi = r["ratio_interval"]
        ended = {s: f"{r['first_ended_s'][s]:.1f} / {r['last_ended_s'][s]:.1f}" for s in SERVERS}
        lines.append(
            f"| {name} | {sets} | {r['median_tok_s']['corral']:.1f} | {r['median_tok_s']['llama-server']:.1f} "
            f"| {r['ratio_median']:.3f}x | {lo:.3f}-{hi:.3f} | {r['corral_ahead']} of {r['rounds']} "
            f"| {r['vs_base']['corral']:.2f}x | {r['vs_base']['llama-server']:.2f}x | {ended['corral']} "
            f"| {ended['llama-server']} |"
        )
    agree = doc["texts_agree"]
    lines += [
        "",
        "Each server's text for one prompt alone, 16 tokens, under the base model, A and B, differs set by set on "
        "both (the adapters are applied); Corral's and llama-server's texts agree for "
        + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in agree.items()) + ".",
    ]
    return lines


def run(
    binary: Path, model: Path, adapters: dict[str, Path], tokens: int, rounds: int, epochs: int,
    turn_steps: int | None = None,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """`epochs` fresh starts of both servers, `rounds` paired rounds each: the rounds by
    start, and each server's texts of the adapter check."""
    starts: list[dict[str, Any]] = []
    texts: dict[str, dict[str, str]] = {}
    for e in range(epochs):
        servers = {"corral": corral(model, adapters, turn_steps), "llama-server": llama_server(binary, model, adapters)}
        with contextlib.ExitStack() as up:  # which one starts first alternates by start
            urls = {s: up.enter_context(servers[s]) for s in (SERVERS if e % 2 == 0 else SERVERS[::-1])}
            urls = {s: urls[s] for s in SERVERS}
            with httpx.Client(timeout=900) as client:
                for s, url in urls.items():  # loads the model, warms up, and checks the adapters apply
                    texts[s] = check(client, url)
            starts.append(measure(urls, tokens, rounds, e))
        print(f"start {e + 1} of {epochs} done", flush=True)
    return starts, texts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", type=Path, required=True)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=128, help="tokens each stream generates")
    ap.add_argument("--rounds", type=int, default=8, help="paired rounds per start of the servers")
    ap.add_argument("--epochs", type=int, default=2, help="fresh starts of both servers (bench/intervals.py)")
    ap.add_argument("--out", type=Path, default=OUT, help="where lora.json, .md and .png go")
    ap.add_argument("--turn-steps", type=int, default=None, help="Corral's lora_turn_steps (default: the config's default)")
    a = ap.parse_args()
    a.epochs = max(1, a.epochs)
    model = a.model.resolve()
    if not model.is_file():
        raise SystemExit(f"model not found: {model} (run `make model`)")
    with tempfile.TemporaryDirectory(prefix="corral-bench-lora-") as folder:
        starts, texts = run(
            a.llama_server, model, make_adapters(model, Path(folder)), a.tokens, a.rounds, a.epochs, a.turn_steps
        )
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "tokens": a.tokens, "rounds": a.rounds, "epochs": a.epochs, "slots": SLOTS, "streams": STREAMS,
        "rank": RANK, "turn_steps": a.turn_steps if a.turn_steps is not None else LORA_TURN_STEPS, "adapters": {k: f"bench/lora_adapter.py, seed {v}" for k, v in SEEDS.items()},
        "texts": texts,
        "texts_agree": {k: texts["corral"][k] == texts["llama-server"][k] for k in texts["corral"]},
        "results": summarize(starts),
        "rounds_raw": starts,
    }
    publish(a.out, "lora", doc, table(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
