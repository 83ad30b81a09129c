"""bench.load_options' chart: KV bytes a token and tokens a second by KV cache type and
flash attention, Corral against llama-server with the same flags (bench/load_options.py)."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.chart_drawing import COLOURS, Doc, bars, figure, save, where


def load_options(doc: Doc, png: Path) -> Path:
    rows = doc["results"]
    groups = [f"{r['cache']}\nFA {r['flash_attn']}" for r in rows]  # FA: flash attention
    names = ["corral", "llama-server"]
    colours = (COLOURS["Corral"], COLOURS.get("llama-server", COLOURS["other"]))
    fig, (left, right) = figure(
        "KV cache types and flash attention, Corral and llama-server with the same flags",
        where(doc, f"demo model, {doc['n_ctx']} cells, greedy completions of {doc['tokens']} tokens, "
                   f"{doc['rounds']} paired rounds"),
        ncols=2, size=(11.0, 4.6),
    )
    bars(
        left, groups, {n: [r["kv_bytes_per_token"][n] for r in rows] for n in names},
        "KV cache bytes a token", colours=colours, label=lambda v: f"{v:,.0f}",
    )
    left.set_title("KV cache bytes a token (from each server's log)")
    left.legend(fontsize=8)
    bars(
        right, groups, {n: [statistics.median(r["tok_s"][n]["4"]) for r in rows] for n in names},
        "tokens a second, 4 streams (median of rounds)", colours=colours, label=lambda v: f"{v:.0f}",
    )
    right.set_title("generation speed, 4 streams")
    return save(fig, png)
