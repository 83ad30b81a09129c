"""corral/status_table.py: `corral status`'s table fits the width it is given."""

from __future__ import annotations

from typing import Any

import pytest

from corral.status_table import ago, elide, human_bytes, render, render_fleet

NOW = 1_800_000_000.0
ERROR = "worker exited with code 1 before Ready:\nllama_model_load: error loading model: invalid magic"


def model(name: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name, "state": "stopped", "pid": None, "rss_bytes": None, "slots": 2, "slots_busy": 0,
        "queued": 0, "waiting": 0, "requests_per_minute": 0, "last_used": None, "last_error": None,
    }
    return {**base, **fields}


PAYLOAD: dict[str, Any] = {
    "models": [
        model("gemma-3-270m", state="ready", pid=4242, rss_bytes=300 * 2**20, slots=4, slots_busy=3,
              queued=1, waiting=2, requests_per_minute=17, last_used=NOW - 125),
        model("qwen2.5-coder-7b-instruct-q4", state="failed", last_error=ERROR),
    ],
    "load_queue": [],
    "config_error": None,
    "needs_restart": [],
}


def rows(text: str) -> list[list[str]]:
    return [line.split("  ") for line in text.splitlines()]


def test_a_wide_terminal_shows_every_column_and_the_whole_error() -> None:
    text = render(PAYLOAD, 200, NOW)
    header, ready, failed = text.splitlines()
    assert header.split() == ["MODEL", "STATE", "PID", "MEM", "SLOTS", "QUEUED", "RPM", "LAST", "USED", "LAST", "ERROR"]
    assert ready.split() == ["gemma-3-270m", "ready", "4242", "300.0", "MiB", "3/4", "3", "17", "2m", "ago", "-"]
    # The error on one line, whole: the newline in it is a space.
    assert failed.endswith(" ".join(ERROR.split()))
    assert failed.split()[:8] == ["qwen2.5-coder-7b-instruct-q4", "failed", "-", "-", "0/2", "0", "0", "never"]
    # Columns line up: every cell of a column starts where its header does.
    assert ready.index("ready") == header.index("STATE") == failed.index("failed")
    assert max(len(line) for line in text.splitlines()) <= 200


@pytest.mark.parametrize(
    ("width", "header"),
    [
        (100, "MODEL STATE PID MEM SLOTS QUEUED RPM LAST USED LAST ERROR"),
        (90, "MODEL STATE MEM SLOTS QUEUED LAST USED LAST ERROR"),  # PID and RPM go first
        (80, "MODEL STATE MEM SLOTS QUEUED LAST ERROR"),
    ],
)
def test_a_middling_width_elides_the_error_and_the_name_then_drops_columns(width: int, header: str) -> None:
    lines = render(PAYLOAD, width, NOW).splitlines()
    assert all(len(line) <= width for line in lines)
    assert lines[0].split() == header.split()
    # Both elided to about their soft minimum (24 and 16), neither to a stub.
    name, *_ = lines[2].split()
    assert name.startswith("qwen2.5-coder-7b") and name.endswith("…")
    assert lines[2].endswith("  worker exited with code…")


def test_a_narrow_terminal_drops_the_least_needed_columns() -> None:
    lines = render(PAYLOAD, 60, NOW).splitlines()
    assert all(len(line) <= 60 for line in lines)
    assert lines[0].split() == ["MODEL", "STATE", "SLOTS", "LAST", "ERROR"]
    assert lines[1].split() == ["gemma-3-270m", "ready", "3/4", "-"]
    assert lines[2].split()[1:3] == ["failed", "0/2"] and lines[2].endswith("…")


def test_below_the_narrowest_table_lines_are_cut_to_the_width() -> None:
    lines = render(PAYLOAD, 20, NOW).splitlines()
    assert all(len(line) <= 20 for line in lines) and lines[1].startswith("gemma-3…")


def test_config_trouble_above_and_the_load_queue_below() -> None:
    payload = {
        **PAYLOAD,
        "config_error": "models.x.slots: must be 1..256, got 0",
        "needs_restart": ["server.port", "server.host"],
        "load_queue": [{"model": "big", "reason": "waiting for 3.0 GiB of memory_budget"}],
    }
    lines = render(payload, 120, NOW).splitlines()
    assert lines[0] == "config error (the server runs its last good config): models.x.slots: must be 1..256, got 0"
    assert lines[1] == "needs restart to take effect: server.port, server.host"
    assert lines[2] == "" and lines[3].startswith("MODEL")
    assert lines[-1] == "waiting to load: big (waiting for 3.0 GiB of memory_budget)"


def test_no_models_and_not_a_corral_answer() -> None:
    assert render({**PAYLOAD, "models": []}, 80, NOW) == "no models configured"
    with pytest.raises(ValueError, match="is this a Corral server"):
        render({"object": "list", "data": []}, 80, NOW)
    with pytest.raises(ValueError):
        render({"models": ["chat"]}, 80, NOW)


def test_cells() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 * 2**30, None, -1, True)] == [
        "0 B", "1023 B", "1.5 KiB", "5.0 GiB", "-", "-", "-",
    ]
    assert [ago(NOW - s, NOW) for s in (0, 59, 60, 3599, 3600, 86400 * 3)] == [
        "0s ago", "59s ago", "1m ago", "59m ago", "1h ago", "3d ago",
    ]
    assert ago(None, NOW) == "never" and ago(NOW + 30, NOW) == "0s ago"  # clocks a little apart
    assert elide("abcdef", 6) == "abcdef" and elide("abcdef", 4) == "abc…" and elide("abc", 0) == ""


# ---- several servers: `corral status --url A --url B` (issue 25, a fleet view) --------------------


def test_a_fleet_is_one_table_with_each_row_s_host() -> None:
    other: dict[str, Any] = {
        **PAYLOAD, "models": [model("gemma-3-270m", state="ready", slots=4)],
        "config_error": "models.x: unknown key `pathh`", "load_queue": [{"model": "big", "reason": "memory_budget"}],
    }
    text = render_fleet(
        [("http://10.0.0.1:8080", PAYLOAD), ("https://b.example:8443", other), ("http://10.0.0.3:8080", "cannot reach it")],
        200, NOW,
    )
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("HOST"))
    assert header.split()[:3] == ["HOST", "MODEL", "STATE"]
    table = lines[lines.index(header) + 1:]
    hosts = [row.split()[0] for row in table if row and not row.startswith("b.example:8443: waiting")]
    assert hosts == ["10.0.0.1:8080", "10.0.0.1:8080", "b.example:8443"]
    # What concerns a whole server is named by its host, above (trouble) or below (queue).
    above = lines[: lines.index(header)]
    assert "10.0.0.3:8080: cannot reach it" in above
    assert any(line.startswith("b.example:8443: config error") and "pathh" in line for line in above)
    assert lines[-1] == "b.example:8443: waiting to load: big (memory_budget)"


def test_a_fleet_table_fits_the_width_and_says_when_nobody_answered() -> None:
    answers: list[tuple[str, dict[str, Any] | str]] = [("http://a:1", PAYLOAD), ("http://b:2", {"no": "models"})]
    text = render_fleet(answers, 60, NOW)
    assert all(len(line) <= 60 for line in text.splitlines())
    assert "b:2: the answer has no `models` list: is this a Corral server?" in " ".join(text.split())  # wrapped
    assert render_fleet([("http://a:1", "refused")], 80, NOW).splitlines() == ["a:1: refused", "", "no server answered"]
    # A server with no models still shows: its row says so.
    empty = render_fleet([("http://a:1", {**PAYLOAD, "models": []})], 80, NOW).splitlines()
    assert empty[1].split()[:2] == ["a:1", "-"] and "no models configured" in empty[1]


UPSTREAMS = [
    {"name": "qwen", "model": "qwen2.5-7b", "local": False, "replicas": [
        {"url": "http://10.0.0.2:8080/v1", "healthy": True, "in_flight": 3, "last_error": None, "requests": {"ok": 9}},
        {"url": "http://10.0.0.3:8080/v1", "healthy": False, "in_flight": 0,
         "last_error": "all attempts to connect failed", "requests": {}},
    ]},
]


def test_models_served_elsewhere_are_a_line_each_with_their_replicas() -> None:
    text = render({**PAYLOAD, "upstreams": UPSTREAMS}, 400, NOW)
    assert text.splitlines()[-1] == (
        "upstream qwen: 1 of 2 replicas up: http://10.0.0.2:8080/v1 (3 in flight), "
        "http://10.0.0.3:8080/v1 (down: all attempts to connect failed)"
    )
    # A front with no model of its own: the upstreams alone, not "no models configured".
    alone = render({**PAYLOAD, "models": [], "upstreams": UPSTREAMS}, 400, NOW)
    assert alone.startswith("upstream qwen: 1 of 2 replicas up") and "no models configured" not in alone
    fleet = render_fleet([("http://front:8080", {**PAYLOAD, "upstreams": UPSTREAMS})], 400, NOW)
    assert fleet.splitlines()[-1].startswith("front:8080: upstream qwen: 1 of 2 replicas up")


def test_queued_shows_the_line_by_class_once_a_class_other_than_normal_waits() -> None:
    def cell(**fields: Any) -> str:
        header, row = render({"models": [model("m", state="ready", waiting=7, queued=1, **fields)]}, 200, NOW).splitlines()
        start = header.index("QUEUED") + len("QUEUED")  # right-aligned under its header
        return row[:start].split("  ")[-1].strip()

    by = {"interactive": 1, "normal": 2, "batch": 4}
    assert cell(waiting_by_priority=by) == "8 (i1 n2 b4)"
    assert cell(waiting_by_priority={"interactive": 0, "normal": 0, "batch": 7}) == "8 (b7)"
    # One class, as without keys, or an older server's answer: the count alone.
    assert cell(waiting_by_priority={"interactive": 0, "normal": 7, "batch": 0}) == "8"
    assert cell() == "8"
