"""bench.images' chart: running streams' gaps between tokens while an image request is in,
and the image request's first token, Corral against llama-server (bench/images.py)."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.chart_drawing import COLOURS, Doc, bars, figure, save, where


def images(doc: Doc, png: Path) -> Path:
    setup, results = doc["setup"], doc["results"]
    names = list(results)
    fig, (left, right) = figure(
        "Text streams while image requests arrive, and the image requests themselves",
        where(doc, f"demo model, {setup['streams']} greedy streams, {setup['images']} image(s) of the "
                   f"{setup['size']} projector, {setup['cpus']} CPU cores"),
        ncols=2, size=(10.0, 4.6),
    )
    colours = tuple(COLOURS.get("Corral" if n == "corral" else n, COLOURS["other"]) for n in names)
    bars(
        left, ["median gap", "worst gap while\nan image was in", "worst gap, as long\nwith no image"],
        {n: [results[n]["median_gap_ms"], results[n]["worst_gap_ms"], results[n].get("worst_gap_after_ms", 0.0)] for n in names},
        "ms between two tokens of a stream (log)", colours=colours, log=True, label=lambda v: f"{v:,.0f} ms",
    )
    left.set_title("streams' gaps between tokens")
    left.legend(fontsize=8)
    bars(
        right, ["image request's first token"],
        {n: [statistics.median(results[n]["image_first_token_s"])] for n in names},
        "seconds", colours=colours, label=lambda v: f"{v:.0f} s",
        above=["\n".join(f"{n}: {results[n]['tokens_during']:,} stream tokens meanwhile" for n in names)],
    )
    right.set_title("encode and prefill of an image")
    return save(fig, png)
