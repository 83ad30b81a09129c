"""`corral status`'s table: GET /admin/models as text that fits the terminal. Pure: the
caller passes the width and the wall clock, so tests need neither a terminal nor time."""

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
    return str(sum(p for p in parts if isinstance(p, int)))


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


def _layout(models: list[dict[str, Any]], width: int, now: float) -> tuple[list[Column], list[int], list[list[str]]]:
    """The columns kept, their widths and the cells. Eliding an error to a stub tells less
    than a dropped PID would, so columns go (PID, RPM, LAST USED, MEM, QUEUED) before
    anything is elided below its soft minimum."""
    columns = list(COLUMNS)
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


def table(models: list[dict[str, Any]], width: int, now: float) -> list[str]:
    """The rows, header first, no wider than `width`; below the narrowest table (MODEL,
    STATE, SLOTS and LAST ERROR at their least, about 36 columns), lines are cut."""
    columns, widths, cells = _layout(models, width, now)
    lines = []
    for row in [[c.header for c in columns], *cells]:
        parts = []
        for c, w, text in zip(columns, widths, row):
            text = elide(text, w)
            parts.append(text.rjust(w) if c.right else text.ljust(w))
        lines.append(elide(GAP.join(parts).rstrip(), width))
    return lines


def render(payload: dict[str, Any], width: int, now: float) -> str:
    """The whole of `corral status`: the server's config trouble above the table (it
    concerns every model), the load queue below it. Raises ValueError for an answer that
    is not GET /admin/models's."""
    models = payload.get("models")
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise ValueError("the answer has no `models` list: is this a Corral server?")
    wrap = max(width, 20)
    out: list[str] = []
    if error := payload.get("config_error"):
        out += textwrap.wrap(f"config error (the server runs its last good config): {one_line(error)}", wrap)
    if restart := payload.get("needs_restart"):
        names = ", ".join(str(x) for x in restart) if isinstance(restart, list) else str(restart)
        out += textwrap.wrap(f"needs restart to take effect: {names}", wrap)
    if out:
        out.append("")
    out += table(models, width, now) if models else ["no models configured"]
    queue = payload.get("load_queue")
    if isinstance(queue, list) and queue:
        out.append("")
        for entry in queue:
            if isinstance(entry, dict):
                line = f"waiting to load: {entry.get('model')} ({one_line(entry.get('reason'))})"
                out += textwrap.wrap(line, wrap)
    return "\n".join(out)
