"""bench.priorities' chart: an interactive key's time to first token beside a batch job,
against its idle figure, and the batch key's tokens a second (bench/priorities.py)."""

from __future__ import annotations

from pathlib import Path

from bench.chart_drawing import COLOURS, Doc, bars, figure, save, where


def priorities(doc: Doc, png: Path) -> Path:
    setup, results = doc["setup"], doc["results"]
    names = list(results)
    fig, (left, right) = figure(
        "An interactive key beside a batch job: priorities, one first-come line, llama-server",
        where(doc, f"demo model, {setup['slots']} slots, {setup['batch']} batch generations in flight, "
                   f"a turn every {setup['every_s']:g} s, {setup['cpus']} CPU cores"),
        ncols=2, size=(11.0, 4.6),
    )
    palette = [COLOURS["Corral"], COLOURS["second"], COLOURS["llama-server"]]
    colours = tuple(palette[min(i, len(palette) - 1)] for i, _ in enumerate(names))
    bars(
        left, ["p50 / idle", "p95 / idle"],
        {n: [results[n]["p50_over_idle"], results[n]["p95_over_idle"]] for n in names},
        "interactive TTFT against the same percentile idle (log)", colours=colours, log=True, label=lambda v: f"{v:.2f}x",
    )
    left.axhline(1.5, linestyle="--", linewidth=1, color="grey")
    left.set_title("interactive time to first token (target: p95 within 1.5x)")
    left.legend(fontsize=8)
    bars(
        right, ["batch key"], {n: [results[n]["batch_tok_s"]] for n in names},
        "tokens a second", colours=colours, label=lambda v: f"{v:.0f}",
    )
    right.set_title("the batch key's throughput meanwhile")
    return save(fig, png)
