"""bench.lora's chart: 4 streams' tokens a second on the base model, one adapter, two, and
the base beside two, Corral against llama-server, and each against its own base-only load
(bench/lora.py)."""

from __future__ import annotations

from pathlib import Path

from bench.chart_drawing import COLOURS, Doc, bars, figure, save, times, where


def lora(doc: Doc, png: Path) -> Path:
    results = doc["results"]
    names = list(results)
    groups = [
        f"{n}\n(" + ", ".join(f"{r['sets'].count(a)} {a}" for a in dict.fromkeys(r["sets"])) + ")"
        for n, r in results.items()
    ]
    servers = {"Corral": "corral", "llama-server": "llama-server"}
    colours = (COLOURS["Corral"], COLOURS["llama-server"])
    fig, (left, right) = figure(
        "LoRA adapters: 4 greedy streams, each on its adapter by per-request `lora`, Corral and llama-server",
        where(doc, f"demo model, two random-weight rank-{doc['rank']} adapters A and B, {doc['slots']} slots, "
                   f"{doc['tokens']}-token completions, {doc['rounds']} paired rounds"
                   + (f" in each of {doc['epochs']} starts" if doc.get("epochs", 1) > 1 else "")),
        ncols=2, size=(12.0, 5.0), width_ratios=(1.5, 1),
    )
    bars(
        left, groups, {label: [results[n]["median_tok_s"][s] for n in names] for label, s in servers.items()},
        "tokens/s, 4 streams together (median of rounds)", colours=colours,
        above=[f"{times(results[n]['ratio_median'])} ({results[n]['ratio_interval'][0]:.2f}–"
               f"{results[n]['ratio_interval'][1]:.2f})" for n in names],
        dots={label: [results[n]["tok_s"][s] for n in names] for label, s in servers.items()},
    )
    left.set_title("aggregate speed (bold: Corral / llama-server, median of pairs, 95% interval)")
    bars(
        right, [g.split("\n")[0] for g in groups],
        {label: [results[n]["vs_base"][s] for n in names] for label, s in servers.items()},
        "tokens/s against the same server's base-only load", colours=colours, label=times,
    )
    right.axhline(1.0, color="black", lw=0.8, ls="--")
    right.tick_params(axis="x", labelrotation=15)
    right.set_title("what the adapters and mixing sets cost each server")
    return save(fig, png)
