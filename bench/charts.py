"""Charts of the benchmark results: a PNG beside each results table.

  python -m bench.charts [bench/results/NAME.json ...]

Every bench script writes bench/results/NAME.json and NAME.md, and then, through
`write_chart`, NAME.png from the JSON as written. This command draws them again from the
JSON files alone, without running anything: all of bench/results/ by default, or the files
named. The kind of chart follows from the file's name (`KINDS`); a JSON that is an input or
an old snapshot rather than a result (peer-*.json, the pass/fail lists of llama.cpp's server
tests that docs/upstream.md compares; hostile_prompt.before-*.json, the run before a fix) has
no kind and no chart.

The charts show what the tables do, no more: tokens per second, seconds or milliseconds on
a labelled axis from zero (a log scale says so), ratios around a dashed line at 1.0, the
ratio the table leads with written on the chart, and in the title what was measured and,
where the JSON records it, on which machine and when. Rendering uses the Agg backend and
writes no version or time into the PNG, so the same JSON gives the same file with the same
matplotlib.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

from bench.chart_drawing import RESULTS, STYLE, Doc
from bench.chart_images import images
from bench.chart_load_options import load_options
from bench.chart_lora import lora
from bench.chart_priorities import priorities
from bench.chart_kinds import (
    agents, choices, constraint_engines, first_constraint, hostile_prompt, overhead, speculative,
    structured_throughput, throughput, throughput_pairs, upstream,
)

# Which function draws which results file: NAME.json is drawn by the first entry whose name
# is NAME or begins NAME's "name-" (speculative-chat, upstream-back-threads-1, ...).
KINDS: list[tuple[str, Callable[[Doc, Path], Path]]] = [
    ("throughput-pairs", throughput_pairs),
    ("throughput", throughput),
    ("structured_throughput", structured_throughput),
    ("choices", choices),
    ("constraint_engines", constraint_engines),
    ("first_constraint", first_constraint),
    ("hostile_prompt", hostile_prompt),
    ("overhead", overhead),
    ("speculative", speculative),
    ("agents", agents),
    ("upstream", upstream),
    ("images", images),
    ("load_options", load_options),
    ("priorities", priorities),
    ("lora", lora),
]


def kind_of(json_path: Path) -> Callable[[Doc, Path], Path] | None:
    stem = json_path.stem
    for name, draw in KINDS:
        if stem == name or stem.startswith(name + "-"):
            return draw
    return None


def write_chart(json_path: Path, png: Path | None = None) -> Path | None:
    """Draw NAME.json (as written: the chart of a new run and of `python -m bench.charts` are
    the same) into NAME.png beside it, or `png`. None for a file with no kind of chart."""
    draw = kind_of(json_path)
    if draw is None:
        return None
    with matplotlib.rc_context(STYLE):
        return draw(json.loads(json_path.read_text()), png or json_path.with_suffix(".png"))


def publish(out: Path, name: str, doc: object, lines: Sequence[str]) -> None:
    """A run's results: NAME.json (`doc`), NAME.md (`lines`) and NAME.png in `out`, and the
    table on the terminal."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    write_chart(out / f"{name}.json")
    print("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    paths = [Path(a) for a in args] or sorted(RESULTS.glob("*.json"))
    for path in paths:
        out = write_chart(path)
        print(f"{out}" if out else f"{path}: no chart (not a results file of a known bench)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
