"""`corral status`'s table: GET /admin/models as text that fits the terminal, of one server
or of several in one table (a fleet). Pure: the caller passes the width and the wall clock,
so tests need neither a terminal nor time."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Callable

ELLIPSIS = "…"
GAP = "  "


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict[str, Any], float], str]
    # Columns are dropped, highest first, when the table does not fit; 0: never.
    drop_rank: int = 0
    # The narrowest an elidable column becomes: first softly (while dropping columns
    # still helps), then at the least (None: it is never elided).
    soft_min: int | None = None
    hard_min: int | None = None
    right: bool = False  # numbers line up on the right


def human_bytes(n: object) -> str:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def ago(then: object, now: float) -> str:
    """How long ago a Unix time was, in its largest whole unit."""
    if not isinstance(then, (int, float)) or isinstance(then, bool):
        return "never"
    seconds = max(0, int(now - then))  # a server clock ahead of ours reads as "0s ago"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def elide(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + ELLIPSIS if width > 0 else ""


def one_line(text: object) -> str:
    # A traceback or a multi-line llama.cpp message would break the table's rows.
    return " ".join(str(text).split()) if text else "-"


def _num(value: object) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "-"


def _slots(m: dict[str, Any], _now: float) -> str:
    return f"{_num(m.get('slots_busy'))}/{_num(m.get('slots'))}"


def _queued(m: dict[str, Any], _now: float) -> str:
    # Both lines a request can stand in: the router's for a slot, and the worker's own.
    parts = [m.get("waiting"), m.get("queued")]
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in parts):
        return "-"
    return str(sum(p for p in parts if isinstance(p, int))) + _by_class(m.get("waiting_by_priority"))


def _by_class(counts: object) -> str:
    """The router's line by class, as " (i1 n2 b5)" (each class's initial, the empty ones
    left out); nothing while every request waits in the normal class, as on a server
    whose keys all have one."""
    if not isinstance(counts, dict):
        return ""
    shown = {str(k): v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    if set(shown) <= {"normal"}:
        return ""
    return " (" + " ".join(f"{k[:1]}{v}" for k, v in shown.items()) + ")"


COLUMNS: tuple[Column, ...] = (
    Column("MODEL", lambda m, _: str(m.get("name", "?")), soft_min=16, hard_min=8),
    Column("STATE", lambda m, _: str(m.get("state", "?"))),
    Column("PID", lambda m, _: _num(m.get("pid")), drop_rank=5, right=True),
    Column("MEM", lambda m, _: human_bytes(m.get("rss_bytes")), drop_rank=2, right=True),
    Column("SLOTS", _slots, right=True),
    Column("QUEUED", _queued, drop_rank=1, right=True),
    Column("RPM", lambda m, _: _num(m.get("requests_per_minute")), drop_rank=4, right=True),
    Column("LAST USED", lambda m, now: ago(m.get("last_used"), now), drop_rank=3),
    Column("LAST ERROR", lambda m, _: one_line(m.get("last_error")), soft_min=24, hard_min=10),
)


def _fit(columns: list[Column], natural: list[int], width: int, hard: bool) -> list[int] | None:
    """Widths that fit `width` by eliding the last error, then the names, down to their
    soft (or hard) minimum; None if that is not enough."""
    widths = list(natural)
    over = sum(widths) + len(GAP) * (len(widths) - 1) - width
    # The last error first: it is the longest and the least needed in full at a glance.
    for i in sorted(range(len(columns)), key=lambda i: columns[i].header != "LAST ERROR"):
        floor = columns[i].hard_min if hard else columns[i].soft_min
        if over <= 0 or floor is None:
            continue
        cut = min(over, max(widths[i] - floor, 0))
        widths[i] -= cut
        over -= cut
    return widths if over <= 0 else None


def _layout(
    models: list[dict[str, Any]], width: int, now: float, all_columns: tuple[Column, ...] = COLUMNS
) -> tuple[list[Column], list[int], list[list[str]]]:
    """The columns kept, their widths and the cells. Eliding an error to a stub tells less
    than a dropped PID would, so columns go (PID, RPM, LAST USED, MEM, QUEUED) before
    anything is elided below its soft minimum."""
    columns = list(all_columns)
    for hard in (False, True):
        while True:
            cells = [[c.cell(m, now) for c in columns] for m in models]
            natural = [max([len(c.header), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
            widths = _fit(columns, natural, width, hard)
            if widths is not None:
                return columns, widths, cells
            droppable = [c for c in columns if c.drop_rank]
            if not droppable:
                break
            columns.remove(max(droppable, key=lambda c: c.drop_rank))
    # Not even the narrowest table fits: every column at its least, lines cut at `width`.
    return columns, [c.hard_min or n for c, n in zip(columns, natural)], cells


# A fleet's table (`corral status --url A --url B`) leads with the host of each row.
HOST = Column("HOST", lambda m, _: str(m.get("host", "?")), soft_min=12, hard_min=8)


def table(models: list[dict[str, Any]], width: int, now: float, hosts: bool = False) -> list[str]:
    """The rows, header first, no wider than `width`; below the narrowest table (MODEL,
    STATE, SLOTS and LAST ERROR at their least, about 36 columns), lines are cut."""
    columns, widths, cells = _layout(models, width, now, (HOST, *COLUMNS) if hosts else COLUMNS)
    lines = []
    for row in [[c.header for c in columns], *cells]:
        parts = []
        for c, w, text in zip(columns, widths, row):
            text = elide(text, w)
            parts.append(text.rjust(w) if c.right else text.ljust(w))
        lines.append(elide(GAP.join(parts).rstrip(), width))
    return lines


def _models(payload: dict[str, Any]) -> list[dict[str, Any]]:
    models = payload.get("models")
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise ValueError("the answer has no `models` list: is this a Corral server?")
    return models


def _troubles(payload: dict[str, Any], prefix: str = "") -> list[str]:
    """What concerns every model of a server: its config trouble."""
    out = []
    if error := payload.get("config_error"):
        out.append(f"{prefix}config error (the server runs its last good config): {one_line(error)}")
    if restart := payload.get("needs_restart"):
        names = ", ".join(str(x) for x in restart) if isinstance(restart, list) else str(restart)
        out.append(f"{prefix}needs restart to take effect: {names}")
    return out


def _queue(payload: dict[str, Any], prefix: str = "") -> list[str]:
    queue = payload.get("load_queue")
    entries = queue if isinstance(queue, list) else []
    return [
        f"{prefix}waiting to load: {e.get('model')} ({one_line(e.get('reason'))})" for e in entries if isinstance(e, dict)
    ]


def _upstreams(payload: dict[str, Any], prefix: str = "") -> list[str]:
    """A line per model served elsewhere: its replicas, and which are out of rotation."""
    entries = payload.get("upstreams")
    out = []
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or not isinstance(e.get("replicas"), list):
            continue
        replicas = [r for r in e["replicas"] if isinstance(r, dict)]
        up = sum(1 for r in replicas if r.get("healthy"))
        parts = [
            f"{r.get('url')} ({r.get('in_flight', 0)} in flight)" if r.get("healthy")
            else f"{r.get('url')} (down: {one_line(r.get('last_error'))})"
            for r in replicas
        ]
        local = " and its own worker" if e.get("local") else ""
        out.append(f"{prefix}upstream {e.get('name')}: {up} of {len(replicas)} replicas up{local}: {', '.join(parts)}")
    return out


def _wrapped(lines: list[str], width: int) -> list[str]:
    return [part for line in lines for part in textwrap.wrap(line, max(width, 20))]


def render(payload: dict[str, Any], width: int, now: float) -> str:
    """The whole of `corral status`: the server's config trouble above the table (it
    concerns every model), the load queue below it. Raises ValueError for an answer that
    is not GET /admin/models's."""
    models = _models(payload)
    out = _wrapped(_troubles(payload), width)
    if out:
        out.append("")
    remote = _upstreams(payload)
    out += table(models, width, now) if models else [] if remote else ["no models configured"]
    if remote:
        out += ["", *_wrapped(remote, width)] if models else _wrapped(remote, width)
    if queue := _queue(payload):
        out += ["", *_wrapped(queue, width)]
    return "\n".join(out)


def _host_of(url: str) -> str:
    """A server's name in a fleet's table: its URL without the scheme."""
    return url.split("://", 1)[-1]


def render_fleet(answers: list[tuple[str, dict[str, Any] | str]], width: int, now: float) -> str:
    """`corral status --url A --url B`: one table of every server's models, a HOST column
    first, and above it a line for each server that did not answer (its error) or answered
    something else; each server's config trouble and load queue, named by host."""
    rows: list[dict[str, Any]] = []
    above: list[str] = []
    below: list[str] = []
    for url, answer in answers:
        host = _host_of(url)
        if isinstance(answer, str):
            above.append(f"{host}: {answer}")
            continue
        try:
            models = _models(answer)
        except ValueError as exc:
            above.append(f"{host}: {exc}")
            continue
        above += _troubles(answer, f"{host}: ")
        below += _upstreams(answer, f"{host}: ") + _queue(answer, f"{host}: ")
        rows += [{**m, "host": host} for m in models] or [{"host": host, "name": "-", "state": "no models configured"}]
    out = _wrapped(above, width)
    if out:
        out.append("")
    out += table(rows, width, now, hosts=True) if rows else ["no server answered"]
    if below:
        out += ["", *_wrapped(below, width)]
    return "\n".join(out)
