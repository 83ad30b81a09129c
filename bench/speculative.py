"""Speculative decoding on a code-editing load (issue 24, item 4): Corral's n-gram drafts
against llama-server's own, each against itself without, in one run.

  python -m bench.speculative [--rounds 2] [--streams 1] [--max-tokens 200] [--draft-max 16]
                              [--llama-server PATH] [--draft-layers N | --draft-model PATH]

The load: a Python file of about 60 lines, then an edit to make ("rename this function,
write the whole file again"), a streamed greedy answer of at most `--max-tokens` tokens;
`--streams` such requests at once, `--rounds` times, each with another edit. Reported per
server: generated tokens per second after the first token (the decode phase, where drafts
act), and the speed-up of drafts over the same server without them. Servers, one after the
other with the same model, slots and the demo model's built-in Gemma format:

- corral, `spec_type = "none"` and `spec_type = "ngram"` (`draft_max`);
- llama-server (built from the same llama.cpp), without speculation and with
  `--spec-type ngram-simple` (its n-gram lookup, also no second model, its defaults).

With `--draft-model PATH` (or `--draft-layers N`: the demo model's first N layers, made by
bench/cut_layers.py), a draft model drafts instead: Corral with `draft_model = PATH`,
llama-server with `-md PATH --spec-type draft-simple` (its defaults otherwise).

Results go to bench/results/speculative.json and bench/results/speculative.md (a suffix
names the load, the streams and a draft model).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench import agents
from bench.agents import one_turn
from bench.charts import write_chart
from bench.throughput import DEFAULT_MODEL, OUT

N_CTX = 8192
SLOTS = 4

CODE = "\n".join(
    f"def {name}(items):\n"
    f"    \"\"\"Return the {name.replace('_', ' ')} of the items.\"\"\"\n"
    f"    result = 0\n"
    f"    for item in items:\n"
    f"        result += item.{field} * {k}\n"
    f"    return result\n"
    for k, (name, field) in enumerate(
        [("total_price", "price"), ("total_weight", "weight"), ("total_count", "count"), ("total_tax", "tax"),
         ("total_discount", "discount"), ("total_volume", "volume"), ("total_stock", "stock"),
         ("total_returns", "returns")],
        start=1,
    )
)
EDITS = [
    "Rename the function total_price to sum_prices",
    "Rename the variable result to acc in every function",
    "Change the docstring of total_tax to say it includes VAT",
    "Rename the function total_count to count_items",
    "Add a blank line after every docstring",
    "Rename the parameter items to rows in every function",
]


STORIES = ["a dragon who keeps bees", "a lighthouse keeper's cat", "a train that runs backwards",
           "a city under a lake", "a clockmaker's last clock", "a map that redraws itself", "two rival bakers"]
LOAD = "code"  # set by --load


def messages(edit: str) -> list[dict[str, str]]:
    if LOAD == "chat":
        return [{"role": "user", "content": f"Tell me a story about {STORIES[EDITS.index(edit) % len(STORIES)]}."}]
    return [{"role": "user", "content": f"```python\n{CODE}```\n{edit}. Write the whole file again, nothing else."}]


def serve_corral(
    model: Path, spec_type: str, draft_max: int, draft: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    extra = f'draft_model = "{draft}"\n' if draft is not None else ""
    return agents.serve_corral(model, SLOTS, N_CTX, f'spec_type = "{spec_type}"\ndraft_max = {draft_max}\n' + extra)


def serve_llama(binary: Path, model: Path, spec: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    return agents.serve_llama(binary, model, SLOTS, N_CTX, spec)


def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every round's requests; per request the decode phase's tokens per second."""
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(edit: str) -> None:
        try:
            with httpx.Client() as client:
                t0 = time.monotonic()
                # A story is sampled (temperature 1): greedy, a small model loops, and drafts
                # would win there too.
                temperature = 1.0 if LOAD == "chat" else 0.0
                ttft, text, (prompt, _) = one_turn(client, url, messages(edit), args.max_tokens, temperature)
                total = time.monotonic() - t0
            with lock:
                results.append({"edit": edit, "ttft_s": ttft, "total_s": total, "text": text})
        except BaseException as exc:
            errors.append(exc)

    one(EDITS[0])  # warm-up: the model loads, and the file's prompt is cached like the rest
    results.clear()
    for r in range(args.rounds):
        edits = [EDITS[(r * args.streams + i + 1) % len(EDITS)] for i in range(args.streams)]
        threads = [threading.Thread(target=one, args=(e,)) for e in edits]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    if errors:
        raise errors[0]
    return {"requests": results}


def tokens_per_second(url: str, results: list[dict[str, Any]]) -> float:
    """Generated tokens over decode time (after the first token), summed over requests."""
    n = 0
    for r in results:
        toks = httpx.post(url + "/tokenize", json={"content": r["text"]}, timeout=60).json()["tokens"]
        r["tokens"] = len(toks)
        n += len(toks)
    return n / sum(r["total_s"] - r["ttft_s"] for r in results)


def measure(proc: subprocess.Popen[bytes], url: str, args: argparse.Namespace) -> dict[str, Any]:
    try:
        out = run(url, args)
        out["tokens_per_s"] = tokens_per_second(url, out["requests"])
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def report(doc: dict[str, Any]) -> str:
    what = (
        f"A {doc['code_lines']}-line Python file and an edit to make, the whole file written again"
        if doc["load"] == "code" else "A story asked for, sampled at temperature 1 (nothing to copy: what drafts cost where they cannot help)"
    )
    lines = [
        f"# Speculative decoding on a {'code-editing' if doc['load'] == 'code' else 'chat'} load",
        "",
        f"{what}; "
        f"{doc['streams']} stream(s) at once, {doc['rounds']} rounds, {'greedy, ' if doc['load'] == 'code' else ''}at most {doc['max_tokens']} tokens; "
        f"demo model, {doc['cpus']} CPUs, {doc['date']}. `python -m bench.speculative {doc['command']}`",
        "",
        f"| server | tokens/s without drafts | with {doc.get('drafts', 'n-gram')} drafts | speed-up |",
        "|---|---:|---:|---:|",
    ]
    for name in ("corral", "llama-server"):
        r = doc.get(name)
        if r:
            lines.append(f"| {name} | {r['off']['tokens_per_s']:.1f} | {r['on']['tokens_per_s']:.1f} | {r['speedup']:.2f}x |")
    if "corral" in doc and "llama-server" in doc:
        c, ls = doc["corral"], doc["llama-server"]
        lines += ["", f"Corral with drafts / llama-server with drafts: {c['on']['tokens_per_s'] / ls['on']['tokens_per_s']:.2f}x."]
    same = doc.get("same_text")
    if same is not None:
        lines += ["", f"Corral's answers with and without drafts identical: {same}"
                  + ("" if doc["streams"] == 1 else " (streams at once decode in other batch shapes, which may flip near ties)") + "."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--llama-server", type=Path, default=None)
    ap.add_argument("--load", choices=["code", "chat"], default="code",
                    help="chat: a story each, nothing to copy (what drafts cost where they cannot help)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--draft-model", type=Path, default=None, help="draft with this model instead of n-grams")
    ap.add_argument("--draft-layers", type=int, default=None, help="draft with the model's first N layers")
    args = ap.parse_args()
    global LOAD
    LOAD = args.load
    model = args.model.resolve()
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "command": " ".join(sys.argv[1:]),
        "load": args.load, "rounds": args.rounds, "streams": args.streams, "max_tokens": args.max_tokens, "code_lines": CODE.count("\n") + 1,
    }
    draft = args.draft_model.resolve() if args.draft_model else None
    if args.draft_layers:
        from bench.cut_layers import cut

        draft = cut(model, Path(tempfile.mkdtemp(prefix="draft-")) / f"first{args.draft_layers}.gguf", args.draft_layers)
    if draft is not None:
        doc["drafts"] = f"draft-model ({draft.name})"
    off = measure(*serve_corral(model, "none", args.draft_max), args)
    on = measure(*serve_corral(model, "ngram", args.draft_max, draft), args)
    doc["corral"] = {"off": off, "on": on, "speedup": on["tokens_per_s"] / off["tokens_per_s"]}
    doc["same_text"] = [r["text"] for r in off["requests"]] == [r["text"] for r in on["requests"]]
    if args.llama_server is not None:
        loff = measure(*serve_llama(args.llama_server, model, []), args)
        # Its n-gram lookup with its own defaults (a 12-token lookup, 48-token drafts).
        spec = ["--spec-type", "ngram-simple"] if draft is None else ["-md", str(draft), "--spec-type", "draft-simple"]
        lon = measure(*serve_llama(args.llama_server, model, spec), args)
        doc["llama-server"] = {"off": loff, "on": lon, "speedup": lon["tokens_per_s"] / loff["tokens_per_s"]}
    args.out.mkdir(parents=True, exist_ok=True)
    name = "speculative" + ("" if args.load == "code" else f"-{args.load}") + ("" if args.streams == 1 else f"-{args.streams}")
    name += "" if draft is None else "-draft"
    (args.out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = report(doc)
    (args.out / f"{name}.md").write_text(md)
    write_chart(args.out / f"{name}.json")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
