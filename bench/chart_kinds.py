"""One chart per kind of benchmark result (bench/charts.py picks the kind by file name), each
from the JSON its bench script writes."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bench.chart_drawing import Doc, Series, COLOURS, where, figure, heading, save, times, bars, ratio_strip

def by_level(d: dict[str, Any]) -> list[tuple[int, Any]]:
    """A JSON object keyed by concurrency ("1", "4"), in numeric order."""
    return sorted((int(k), v) for k, v in d.items())


# ---- one function per kind of results file ----------------------------------------------


def throughput(doc: Doc, png: Path) -> Path:
    """bench.throughput: aggregate tok/s against concurrent requests for Corral, llama-server,
    llama-cpp-python's Llama one request at a time and llama_decode alone, and below it the
    ratio the table leads with."""
    fig = Figure(figsize=(9.0, 6.2), dpi=120, layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2.2, 1))
    fig.suptitle(heading(
        "Aggregate generation throughput against concurrent requests",
        where(doc, f"demo model, Corral with {doc['slots']} slots, {doc['tokens']}-token greedy completions, "
                   f"medians of {doc['rounds']} rounds"),
        9.0,
    ), fontsize=10.5)
    lines = [
        ("Corral", "corral_tok_s", COLOURS["Corral"], "-"),
        ("llama-server (same llama.cpp)", "llama_server_tok_s", COLOURS["llama-server"], "-"),
        ("llama-cpp-python Llama, one request at a time", "llama_sequential_tok_s", COLOURS["third"], "-"),
        ("llama_decode alone (no server, no sampling)", "llama_decode_alone_tok_s", COLOURS["other"], "--"),
    ]
    levels: list[int] = []
    for name, key, colour, style in lines:
        if key in doc:
            pts = by_level(doc[key])
            levels = [c for c, _ in pts]
            top.plot(range(len(pts)), [v for _, v in pts], style, marker="o", color=colour, label=name)
    top.set_ylim(bottom=0)
    top.set_ylabel("tokens/s, all requests together")
    top.legend(loc="upper left", fontsize=8)
    key, against = (
        ("corral_vs_llama_server_median_of_pairs", "llama-server (median of paired rounds)")
        if "corral_vs_llama_server_median_of_pairs" in doc else ("corral_vs_llama", "Llama one at a time")
    )
    ratios = [v for _, v in by_level(doc[key])]
    bottom.axhline(1.0, color="black", lw=0.8, ls="--")
    bottom.plot(range(len(ratios)), ratios, "o", color=COLOURS["Corral"])
    for i, r in enumerate(ratios):
        bottom.annotate(times(r), (i, r), textcoords="offset points", xytext=(7, 0), ha="left", va="center",
                        fontsize=8.5, weight="bold")
    span = max(0.1, max(abs(r - 1) for r in ratios) * 1.3)
    bottom.set_ylim(1 - span, 1 + span * 1.4)
    bottom.set_ylabel(f"Corral / {against.split(' (')[0]}")
    bottom.set_title(f"Corral / {against}", fontsize=9, loc="left")
    bottom.set_xticks(range(len(levels)), [str(c) for c in levels])
    bottom.set_xlabel("concurrent requests")
    return save(fig, png)


def throughput_pairs(doc: Doc, png: Path) -> Path:
    """bench.throughput --pairs: every paired round's Corral / llama-server ratio, by start of
    the servers, with the median and its 95% interval, one panel per concurrency."""
    levels = by_level(doc["rates"]["corral"])
    server = dict(by_level(doc["rates"]["llama-server"]))
    starts = doc.get("ratios_per_start")
    epochs = int(doc.get("epochs", 1))
    options = doc.get("corral_options") or []
    fig, axes = figure(
        "Corral / llama-server throughput, paired rounds (both up, taking turns)",
        where(doc, (f"Corral's model table adding {', '.join(options)}; " if options else "")
                   + f"demo model, {doc['tokens']}-token greedy completions, {doc['rounds']} rounds"
                   + (f" in each of {epochs} fresh starts of both servers" if epochs > 1 else "")),
        ncols=len(levels), size=(max(7.5, 5.0 * len(levels)), 4.6),
    )
    for ax, (c, corral) in zip(axes, levels):
        groups = (
            [list(g) for g in starts[str(c)]] if starts else [[a / b for a, b in zip(corral, server[c])]]
        )
        med, lo, hi = ratio_strip(
            ax, groups, "Corral / llama-server tokens/s",
            "fresh start of both servers" if len(groups) > 1 else "round",
        )
        pooled = [r for g in groups for r in g]
        ahead = sum(r > 1.0 for r in pooled)
        ax.set_title(
            f"{c} concurrent request{'s' if c > 1 else ''}: {med:.3f}× ({lo:.3f}–{hi:.3f}), "
            f"Corral ahead in {ahead} of {len(pooled)} rounds"
        )
    return save(fig, png)


def structured_throughput(doc: Doc, png: Path) -> Path:
    """bench.throughput --structured: constrained against unconstrained tok/s in one Corral."""
    levels = by_level(doc["median_tok_s"])
    rounds = dict(by_level(doc["rounds_tok_s"]))
    ratios = dict(by_level(doc["constrained_vs_unconstrained_median_of_pairs"]))
    fig, (ax,) = figure(
        "Structured output: json_schema-constrained against unconstrained completions, one Corral",
        where(doc, f"demo model, {doc['slots']} slots, {doc['threads'] or 'default'} decode thread(s), "
                   f"{doc['tokens']}-token greedy completions, medians of {doc['rounds']} rounds (dots: each round)"),
        size=(8.0, 4.6),
    )
    kinds = ("unconstrained", "constrained")
    bars(
        ax, [f"{c} concurrent request{'s' if c > 1 else ''}" for c, _ in levels],
        {k: [m[k] for _, m in levels] for k in kinds}, "tokens/s, all requests together",
        colours=(COLOURS["other"], COLOURS["Corral"]),
        above=[f"constrained / unconstrained {times(ratios[c])}" for c, _ in levels],
        dots={k: [rounds[c][k] for c, _ in levels] for k in kinds},
    )
    fig.supxlabel("ratio: the median of each round's constrained / unconstrained pair", fontsize=8, color="#555555")
    return save(fig, png)


def choices(doc: Doc, png: Path) -> Path:
    """bench.throughput --choices: n choices in one request against n requests at once."""
    k = doc["choices"]
    one, sep = doc["one_request"], doc["separate"]
    fig, (left, right) = figure(
        f"{k} choices of one prompt: one request with n = {k} against {k} requests at once, one Corral",
        where(doc, f"demo model, {k} slots, a {doc['prompt_tokens']}-token prompt, {doc['tokens']} sampled "
                   f"tokens per choice, {doc['rounds']} rounds each"),
        ncols=2, size=(9.0, 4.4),
    )
    groups = [f"one request,\nn = {k}", f"{k} requests\nat once"]
    bars(left, groups, {"wall time": [one["seconds"], sep["seconds"]]}, "seconds (all rounds)",
         colours=(COLOURS["Corral"],), label=lambda v: f"{v:.1f} s",
         above=["", f"{times(doc['time_ratio_separate_over_n'])} the time"])
    left.set_title("wall time")
    bars(right, groups, {"decoded": [one["decoded"], sep["decoded"]]}, "prompt tokens the worker decoded",
         colours=(COLOURS["Corral"],), label=lambda v: f"{v:,.0f}",
         above=["", f"{times(doc['decoded_ratio_separate_over_n'])} the tokens"])
    right.set_title("prompt tokens decoded")
    return save(fig, png)


ENGINES = {  # bench/constraint_engines.py's names, as its docstring explains them
    "unconstrained": "unconstrained (argmax)",
    "llguidance": "llguidance",
    "llama-full": "llama.cpp grammar,\nwhole vocabulary",
    "llama-check-first": "llama.cpp grammar, sampled\ntoken checked first",
}


def constraint_engines(doc: Doc, png: Path) -> Path:
    """bench.constraint_engines: each engine's cost per token and its generation speed."""
    engines = list(doc["engines"])
    rows = doc["engines"]
    fig, (left, right) = figure(
        "Constrained decoding engines: one JSON schema, greedy, one process, same run",
        where(doc, f"model {doc['model']} (vocabulary {doc['n_vocab']:,}), {doc['threads']} decode thread(s)"),
        ncols=2, size=(10.0, 4.2),
    )
    colours = [
        COLOURS["other"] if e == "unconstrained" else COLOURS["Corral"] if e == "llguidance" else COLOURS["llama-server"]
        for e in engines
    ]
    y = list(range(len(engines)))[::-1]
    ms = [float(rows[e]["choose_ms_per_token"]) for e in engines]
    drawn = left.barh(y, ms, color=colours)
    left.bar_label(drawn, labels=[f"{v:.2f} ms" for v in ms], fontsize=8, padding=2)
    left.set_xscale("log")
    left.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    left.set_xlim(min(0.1, min(ms) / 2), max(ms) * 8)
    left.set_yticks(y, [ENGINES.get(e, e) for e in engines])
    left.set_xlabel("constrain + sample, ms per token (log scale)")
    left.grid(axis="x")
    left.grid(axis="y", visible=False)
    tps = [float(rows[e]["gen_tok_s"]) for e in engines]
    drawn = right.barh(y, tps, color=colours)
    vs = doc["throughput_vs_unconstrained"]
    right.bar_label(drawn, labels=[f"{v:.1f} tok/s ({times(vs[e])})" for v, e in zip(tps, engines)],
                    fontsize=8, padding=2)
    right.set_xlim(0, max(tps) * 1.45)
    right.set_yticks(y, [""] * len(y))
    right.set_xlabel("generation tokens/s, decode included (× unconstrained)")
    right.grid(axis="x")
    right.grid(axis="y", visible=False)
    return save(fig, png)


def first_constraint(doc: Doc, png: Path) -> Path:
    """bench.first_constraint: the streams' step before, and their longest gap while a model's
    first constrained request ran."""
    rounds = doc["rounds"]
    fig, (ax,) = figure(
        "A model's first constrained request (a JSON schema) while sampled streams run on it",
        where(doc, "demo model, one fresh corral serve per round"),
        size=(8.0, 4.4),
    )
    bars(
        ax, [f"round {i} (the request took {r['constrained_request_s']:.2f} s)" for i, r in enumerate(rounds, 1)],
        {
            "streams' median gap before (one decode step)": [r["median_gap_before_s"] * 1000 for r in rounds],
            "longest gap of any stream meanwhile": [r["longest_gap_during_s"] * 1000 for r in rounds],
        },
        "gap between two chunks of a stream, ms", colours=(COLOURS["other"], COLOURS["Corral"]),
        label=lambda v: f"{v:.0f} ms",
        above=[f"{r['extra_delay_in_steps']:.2f} steps of delay beyond a step" for r in rounds],
    )
    return save(fig, png)


def hostile_prompt(doc: Doc, png: Path) -> Path:
    """bench.hostile_prompt: per prompt size and server, the time to the answer and the running
    stream's largest gap in decode steps (medians over runs, whiskers the max)."""
    servers = {k: v for k, v in doc.items() if isinstance(v, dict) and "runs" in v}
    sizes = [row["prompt"] for row in next(iter(servers.values()))["runs"][0]]

    def per_size(runs: list[list[dict[str, Any]]], key: str) -> list[list[float]]:
        return [[float(run[i][key]) for run in runs if float(run[i][key]) >= 0] for i in range(len(sizes))]

    names, to_answer, to_max, gaps, gap_max = [], {}, {}, {}, {}
    for name, v in servers.items():
        statuses = sorted({int(row["status"]) for run in v["runs"] for row in run})
        runs = len(v["runs"])
        label = f"{name} ({runs} run{'s' if runs > 1 else ''}, answers {'/'.join(map(str, statuses))})"
        names.append(label)
        t = per_size(v["runs"], "to_400_ms")
        g = per_size(v["runs"], "gap_in_steps")
        to_answer[label] = [statistics.median(x) for x in t]
        to_max[label] = [max(x) for x in t]
        gaps[label] = [statistics.median(x) if x else None for x in g]
        gap_max[label] = [max(x) if x else None for x in g]
    def colour(label: str) -> str:
        if label.startswith("corral"):
            return COLOURS["Corral"]
        if label.startswith("llama-server"):
            return COLOURS["llama-server"]
        return COLOURS["second"] if "parses" not in label else COLOURS["third"]

    colours = [colour(n) for n in names]
    fig, (left, right) = figure(
        "Huge prompts sent while a greedy stream runs: time to the answer, and the stream's largest gap meanwhile",
        where(doc, "demo model, 4 slots, n_ctx 4096, 2 threads; medians over runs, whiskers the max; "
                   "the controls get the prompts while Corral's stream runs"),
        ncols=2, size=(12.0, 5.2),
    )

    def ms(v: float) -> str:
        return f"{v:.0f}" if v < 1000 else f"{v / 1000:.0f} s"

    bars(left, sizes, {n: to_answer[n] for n in names}, "time to the answer, ms (log scale)",
         colours=colours, label=ms, whiskers={n: to_max[n] for n in names}, log=True)
    left.set_title("time to the answer (400 for Corral and the controls)")
    left.set_xlabel("prompt sent")
    legend = left.get_legend()
    if legend is not None:
        legend.remove()
    bars(right, sizes, {n: gaps[n] for n in names}, "largest gap between two tokens, in decode steps",
         colours=colours, label=lambda v: f"{v:.2f}", whiskers={n: [x or 0.0 for x in gap_max[n]] for n in names},
         missing="stream\nended")
    right.axhline(1.0, color="black", lw=0.8, ls="--")
    right.set_title("the running stream's largest gap (1 = one decode step)")
    right.set_xlabel("prompt sent")
    right.legend(loc="upper left", fontsize=7.5)
    return save(fig, png)


def overhead(doc: Doc, png: Path) -> Path:
    """bench.overhead: this tree against a baseline tree, served side by side, same load."""
    shapes = doc["shapes"]
    rates = doc["rates"]
    fig, (ax,) = figure(
        f"Request-path overhead: {doc['head']} against {doc['baseline']}, served side by side, same run",
        where(doc, f"demo model, 4 slots, medians of {len(next(iter(rates.values()))['now'])} rounds "
                   "(dots: each round)"),
        size=(8.0, 4.6),
    )
    names = list(rates)
    groups = [
        f"{s}: {shapes[s]['concurrency']} clients × {shapes[s]['tokens']} tokens"
        + (f" × {shapes[s]['batches']}" if shapes[s]["batches"] > 1 else "") for s in names
    ]
    bars(
        ax, groups,
        {f"this tree ({doc['head']})": [statistics.median(rates[s]["now"]) for s in names],
         f"baseline ({doc['baseline']})": [statistics.median(rates[s]["baseline"]) for s in names]},
        "tokens/s, all requests together", colours=(COLOURS["Corral"], COLOURS["other"]),
        above=[f"{doc['ratio_median'][s]:.3f}×" for s in names],
        dots={f"this tree ({doc['head']})": [rates[s]["now"] for s in names],
              f"baseline ({doc['baseline']})": [rates[s]["baseline"] for s in names]},
    )
    fig.supxlabel("ratio: the median of each round's this tree / baseline", fontsize=8, color="#555555")
    return save(fig, png)


def speculative(doc: Doc, png: Path) -> Path:
    """bench.speculative: decode-phase tok/s with and without drafts, per server."""
    servers = [s for s in ("corral", "llama-server") if s in doc]
    drafts = doc.get("drafts", "n-gram")
    load = "code-editing" if doc["load"] == "code" else "chat (sampled stories)"
    fig, (ax,) = figure(
        f"Speculative decoding on a {load} load, with and without {drafts} drafts",
        where(doc, f"demo model, {doc['streams']} stream{'s' if doc['streams'] > 1 else ''} at once, "
                   f"{doc['rounds']} rounds, at most {doc['max_tokens']} tokens"),
        size=(8.0, 4.6),
    )
    bars(
        ax, ["Corral" if s == "corral" else "llama-server (same llama.cpp)" for s in servers],
        {"without drafts": [doc[s]["off"]["tokens_per_s"] for s in servers],
         f"with {drafts} drafts": [doc[s]["on"]["tokens_per_s"] for s in servers]},
        "tokens/s of a stream after its first token", colours=(COLOURS["other"], COLOURS["Corral"]),
        above=[f"speed-up {times(doc[s]['speedup'])}" for s in servers],
    )
    if len(servers) == 2:
        c, ls = doc["corral"]["on"]["tokens_per_s"], doc["llama-server"]["on"]["tokens_per_s"]
        fig.supxlabel(f"Corral with drafts / llama-server with drafts: {times(c / ls)}", fontsize=8.5, color="#555555")
    return save(fig, png)


def agents(doc: Doc, png: Path) -> Path:
    """bench.agents: time to first token (median, whisker p95) and wall time, and the prompt
    tokens each server decoded of those it was sent."""
    servers = [s for s in ("corral", "llama-server") if s in doc]
    names = ["Corral" if s == "corral" else "llama-server" for s in servers]
    fig, (left, right) = figure(
        f"Agent-like load: {doc['users']} users on {doc['slots']} slots, {doc['turns']} turns each, "
        "one shared system prompt",
        where(doc, f"demo model, a first turn's prompt {doc['first_prompt_tokens']:,} tokens, "
                   f"replies of at most {doc['reply']} tokens"),
        ncols=2, size=(11.0, 4.8), width_ratios=(2.2, 1),
    )
    keys = ("first_turns", "later_turns")
    groups = ["TTFT, first turns", "TTFT, later turns", "wall time of the load"]
    series: Series = {
        n: [doc[s][k]["ttft_median_s"] for k in keys] + [doc[s]["wall_s"]] for n, s in zip(names, servers)
    }
    whiskers: Series = {n: [doc[s][k]["ttft_p95_s"] for k in keys] + [None] for n, s in zip(names, servers)}
    above = None
    if len(servers) == 2:
        c, ls = doc["corral"], doc["llama-server"]
        above = [times(c[k]["ttft_median_s"] / ls[k]["ttft_median_s"]) for k in keys]
        above.append(times(c["wall_s"] / ls["wall_s"]))
    bars(left, groups, series, "seconds", colours=(COLOURS["Corral"], COLOURS["llama-server"]),
         label=lambda v: f"{v:.2f} s", whiskers=whiskers, above=above)
    left.set_title("TTFT: median bar, p95 whisker" + ("; bold: Corral / llama-server" if above else ""))
    decoded = [doc[s]["prompt_tokens_decoded"] for s in servers]
    sent = [doc[s]["prompt_tokens_sent"] for s in servers]
    bars(right, names, {"decoded": decoded}, "prompt tokens decoded",
         colours=(COLOURS["Corral"],), label=lambda v: f"{v:,.0f}",
         above=[f"{d / s:.0%} of {s:,} sent" for d, s in zip(decoded, sent)])
    for patch, colour in zip(right.patches, (COLOURS["Corral"], COLOURS["llama-server"])):
        patch.set_facecolor(colour)
    right.set_title("prompt tokens decoded (the rest: its cache)")
    return save(fig, png)


def upstream(doc: Doc, png: Path) -> Path:
    """bench.upstream: one-token latency straight to the back and through the front, and every
    stream pair's front / back tokens per second."""
    threads = doc.get("back_threads") or (png.stem.rsplit("-", 1)[1] if "-back-threads-" in png.stem else None)
    ms = 1000.0

    def pct(values: list[float], q: float) -> float:  # as bench/upstream.py takes it
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    direct, relayed = doc["direct_s"], doc["relayed_s"]
    added = [f - d for d, f in zip(direct, relayed)]
    fig, (left, right) = figure(
        "A Corral front relaying to a Corral back on the same machine",
        where(doc, f"demo model, the back's decode threads: {threads or 'every core'}; {doc['requests']} one-token "
                   f"completions and {doc['rounds']} streams of {doc['tokens']} tokens each way, in pairs"),
        ncols=2, size=(10.0, 4.6),
    )
    bars(
        left, ["median", "p99"],
        {"straight to the back": [statistics.median(direct) * ms, pct(direct, 0.99) * ms],
         "through the front": [statistics.median(relayed) * ms, pct(relayed, 0.99) * ms]},
        "one-token completion, ms", colours=(COLOURS["other"], COLOURS["Corral"]), label=lambda v: f"{v:.1f}",
        above=[f"+{statistics.median(added) * ms:.2f} ms (median of pairs)",
               f"+{pct(added, 0.99) * ms:.2f} ms (p99 of pairs)"],
    )
    left.set_title("one-token completion (bold: what the front adds, pair by pair)")
    groups = [list(doc["stream_ratios"])]
    med, lo, hi = ratio_strip(right, groups, "front / back tokens/s", "pair of streams", "one pair")
    right.set_title(f"streams: front / back {med:.3f}× ({lo:.3f}–{hi:.3f})")
    return save(fig, png)
