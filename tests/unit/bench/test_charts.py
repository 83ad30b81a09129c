"""bench/charts.py: every benchmark's results draw a chart, from the JSON committed in
bench/results/, and every results table there has its PNG beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image  # Pillow: a dependency of matplotlib

from bench.charts import RESULTS, kind_of, write_chart

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A results file is a JSON with its Markdown table beside it; the others there are inputs or
# old snapshots (peer-*.json, hostile_prompt.before-*.json) and draw nothing.
RESULT_FILES = sorted(p for p in RESULTS.glob("*.json") if p.with_suffix(".md").is_file())


def test_there_are_results_to_draw() -> None:
    assert len(RESULT_FILES) >= 10


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.stem)
def test_each_results_file_draws_a_valid_png(path: Path, tmp_path: Path) -> None:
    assert kind_of(path) is not None, f"{path.name}: no kind of chart in bench/charts.py's KINDS"
    png = write_chart(path, tmp_path / f"{path.stem}.png")
    assert png == tmp_path / f"{path.stem}.png"
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 20_000, "an almost empty image"
    with Image.open(png) as image:
        assert image.format == "PNG"
        width, height = image.size
        image.verify()  # the chunks' checksums
    assert 600 <= width <= 1600 and 300 <= height <= 900, (width, height)


def test_every_results_table_has_its_chart_beside_it() -> None:
    """A new bench that writes NAME.md and no NAME.png (or whose PNG was not drawn: `python -m
    bench.charts`) fails here."""
    tables = sorted(RESULTS.glob("*.md"))
    assert tables
    assert [t.name for t in tables if not t.with_suffix(".png").is_file()] == []


def test_files_that_are_not_results_draw_nothing(tmp_path: Path) -> None:
    for name in ("peer-corral.json", "hostile_prompt.before-64a2956.json"):
        assert kind_of(RESULTS / name) is None
        assert write_chart(RESULTS / name, tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()


def test_the_same_json_draws_the_same_bytes(tmp_path: Path) -> None:
    """No time or version in the file: a chart redrawn from unchanged results is unchanged."""
    source = RESULTS / "speculative.json"
    first = write_chart(source, tmp_path / "a.png")
    second = write_chart(source, tmp_path / "b.png")
    assert first is not None and second is not None
    assert first.read_bytes() == second.read_bytes()


def test_every_chart_is_shown_in_the_docs() -> None:
    """A chart nobody sees is a chart nobody checks: each one is an image of docs/."""
    docs = "".join(p.read_text() for p in (RESULTS.parent.parent / "docs").rglob("*.md"))
    unshown = sorted(p.name for p in RESULTS.glob("*.png") if f"../bench/results/{p.name})" not in docs)
    assert unshown == []


def test_publish_writes_the_json_the_table_and_the_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.charts import publish

    doc = json.loads((RESULTS / "priorities.json").read_text())
    publish(tmp_path, "priorities", doc, ["| a |", "|---|"])
    assert json.loads((tmp_path / "priorities.json").read_text()) == doc
    assert (tmp_path / "priorities.md").read_text() == "| a |\n|---|\n"
    assert (tmp_path / "priorities.png").stat().st_size > 0
    assert "| a |" in capsys.readouterr().out
