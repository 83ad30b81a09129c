"""The pieces every benchmark chart is drawn with (bench/charts.py): colours, a figure with
its heading, grouped bars with ratios, a strip of per-round ratios."""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.axes import Axes  # noqa: E402  (after the backend is chosen)
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from bench.intervals import clustered_median_interval  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
Doc = dict[str, Any]
Series = dict[str, Sequence[float | None]]

# One colour per party, the same on every chart.
COLOURS = {
    "Corral": "#1f77b4",
    "llama-server": "#ff7f0e",
    "other": "#7f7f7f",
    "second": "#9ecae1",
    "third": "#2ca02c",
}
CYCLE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#7f7f7f")
STYLE: dict[Any, Any] = {  # matplotlib's rcParams for these charts
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.grid.axis": "y",
    "grid.color": "#e0e0e0",
    "axes.axisbelow": True,
    "legend.frameon": False,
}


# ---- shared pieces ---------------------------------------------------------------------


def where(doc: Doc, *extra: str) -> str:
    """The conditions line: what the caller adds, then the machine and date the JSON records."""
    parts = [e for e in extra if e]
    machine = doc.get("machine")
    if isinstance(machine, dict):
        cpus, proc = machine.get("cpus"), machine.get("processor")
        parts.append(f"{cpus} CPU cores" + (f" ({proc})" if proc else ""))
    elif isinstance(machine, str):
        parts.append(machine)
    elif doc.get("cpus"):
        parts.append(f"{doc['cpus']} CPU cores")
    if doc.get("date"):
        parts.append(str(doc["date"])[:16].replace(" ", "\u00a0"))  # to the minute, on one line
    return ", ".join(parts)


def figure(
    title: str, conditions: str, ncols: int = 1, size: tuple[float, float] = (9.0, 4.6), **kw: Any
) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=size, dpi=120, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False, **kw)[0]
    fig.suptitle(heading(title, conditions, size[0]), fontsize=10.5)
    return fig, list(axes)


def heading(title: str, conditions: str, width: float) -> str:
    """The title, then the conditions wrapped to the figure's width (inches)."""
    chars = int(width * 11)
    return "\n".join([*textwrap.wrap(title, chars), *textwrap.wrap(conditions, chars)])


def save(fig: Figure, png: Path) -> Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    # No "Software" entry (matplotlib's version): the file holds the picture, not when or by what.
    fig.savefig(png, format="png", metadata={"Software": None})
    return png


def times(x: float) -> str:
    return f"{x:.2f}×" if abs(x - 1) >= 0.005 or x == 1 else f"{x:.3f}×"


def bars(
    ax: Axes,
    groups: Sequence[str],
    series: Series,
    unit: str,
    *,
    colours: Sequence[str] = CYCLE,
    above: Sequence[str] | None = None,
    label: Callable[[float], str] = lambda v: f"{v:.1f}",
    whiskers: Series | None = None,
    dots: dict[str, Sequence[Sequence[float]]] | None = None,
    log: bool = False,
    missing: str = "n/a",
) -> None:
    """Grouped bars: one group per case, one bar per series, each bar labelled with its
    value; `above`: a line written over each group (the ratio the table leads with);
    `whiskers`: an upper value per bar (a p95, a max); `dots`: the rounds behind each bar."""
    n = len(series)
    width = 0.8 / n
    tops = [0.0] * len(groups)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        heights = [v if v is not None else 0.0 for v in values]
        upper = list((whiskers or {}).get(name, [None] * len(groups)))
        drawn = ax.bar(xs, heights, width * 0.92, label=name, color=colours[i % len(colours)])
        texts = [label(v) if v is not None else missing for v in values]
        if dots:  # the dots sit at the bar's top: the value goes inside
            ax.bar_label(drawn, labels=texts, fontsize=8, label_type="center", color="white", weight="bold")
        for g, (x, h, u) in enumerate(zip(xs, heights, upper)):
            if u is not None and u > h:
                ax.vlines(x, h, u, color="black", lw=0.8)
                ax.hlines(u, x - width / 8, x + width / 8, color="black", lw=0.8)
            end = max(h, u or 0.0)
            if not dots:  # the bar's value, over its whisker where it has one
                ax.annotate(texts[g], (x, end), xytext=(0, 2), textcoords="offset points",
                            ha="center", va="bottom", fontsize=7.5)
            tops[g] = max(tops[g], end)
            for y in (dots or {}).get(name, [[]] * len(groups))[g]:
                ax.plot(x, y, "o", ms=2.5, color="black", alpha=0.6, zorder=3)
                tops[g] = max(tops[g], y)
    top = max(tops)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(unit)
    # Headroom over the tallest bar for its label, the line above it and the legend.
    room = 1.15 + (0.15 if above else 0.0) + (0.2 if n > 1 else 0.0)
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        ax.set_ylim(top=top * room ** 9)
    else:
        ax.set_ylim(0, top * room)
    for g, text in enumerate(above or []):
        if text:  # over the group's tallest bar and its value
            ax.annotate(text, (g, tops[g]), xytext=(0, 16), textcoords="offset points",
                        ha="center", va="bottom", fontsize=9, weight="bold")
    if n > 1:
        ax.legend(loc="upper left", fontsize=8)


def ratio_strip(
    ax: Axes, groups: Sequence[Sequence[float]], what: str, xlabel: str, dot: str = "one round's pair"
) -> tuple[float, float, float]:
    """Each round's ratio as a dot (grouped by start of the servers where there are several),
    each group's median as a bar, and the median of all with its 95% bootstrap interval as a
    band (bench/intervals.py, as the table gives it); a dashed line at 1.0. Returns the
    median and the interval."""
    pooled = [r for g in groups for r in g]
    med = statistics.median(pooled)
    lo, hi = clustered_median_interval(groups)
    ax.axhline(1.0, color="black", lw=0.8, ls="--", zorder=1)
    ax.axhspan(lo, hi, color=COLOURS["Corral"], alpha=0.15, lw=0, label=f"95% interval {lo:.3f}–{hi:.3f}")
    ax.axhline(med, color=COLOURS["Corral"], lw=1.5, label=f"median of all {len(pooled)}: {med:.3f}×")
    # The scale fits 95% of the rounds; a round beyond it is drawn at the edge as an arrow
    # with its value, so that one outlier does not flatten the rest.
    deviations = sorted(abs(r - 1) for r in pooled)
    span = max(0.05, deviations[min(len(deviations) - 1, int(0.95 * len(deviations)))] * 1.15)
    low, high = 1 - span, 1 + span * 1.35  # room above for the legend
    edge = 1 + span

    def strip(xs: Sequence[float], ys: Sequence[float]) -> None:
        inside = [(x, y) for x, y in zip(xs, ys) if low <= y <= edge]
        ax.plot([x for x, _ in inside], [y for _, y in inside], "o", ms=3, color="black", alpha=0.6, zorder=3)
        for x, y in zip(xs, ys):
            if not low <= y <= edge:
                at = edge if y > edge else low
                ax.plot(x, at, "^" if y > edge else "v", ms=5, color="black", zorder=3, clip_on=False)
                ax.annotate(f"{y:.2f}", (x, at), xytext=(4, -3 if y > edge else 3), textcoords="offset points",
                            fontsize=7)

    if len(groups) > 1:
        for i, g in enumerate(groups, 1):
            strip([i + (k - (len(g) - 1) / 2) * 0.5 / max(len(g), 1) for k in range(len(g))], g)
            ax.plot([i - 0.3, i + 0.3], [statistics.median(g)] * 2, color=COLOURS["llama-server"], lw=2, zorder=4)
        ax.plot([], [], color=COLOURS["llama-server"], lw=2, label="each start's median")
        ax.set_xticks(range(1, len(groups) + 1))
    else:
        strip(range(1, len(pooled) + 1), pooled)
        ax.set_xlim(0.3, len(pooled) + 0.7)
    ax.plot([], [], "o", ms=3, color="black", alpha=0.6, label=dot)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(what)
    ax.set_ylim(low, high)
    ax.legend(loc="upper left", fontsize=7.5, ncols=2)
    return med, lo, hi
