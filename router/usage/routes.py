"""GET /admin/usage: the ledger's counts, as JSON or CSV (an admin key's, as all /admin).

Query: `key` (a key's name), `model`, `from` and `to` (a UTC date "2026-11-28", a time
"2026-11-28T13:00", or epoch seconds; `to` is exclusive), `by` ("hour", the default, or
"day") and `format` ("json", or "csv", which `Accept: text/csv` also asks for). Hours older
than the ledger keeps by the hour come back as their days, each row saying its period.
A bad parameter is a 400 naming it.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from dataclasses import asdict
from typing import Any

import msgspec
from quart import Response, request
from quart_trio import QuartTrio

from router.usage.gate import of
from router.usage.store import COUNTS, Row, UsageStore
from supervisor.errors import InvalidRequest

_json = msgspec.json.Encoder()
FIELDS = ("period", "start", "key", "model", *COUNTS)


# Epoch seconds a report may name: 1970 to the end of year 9999, what a datetime can print.
LATEST = 253_402_300_799.0


def instant(text: str | None, param: str) -> float | None:
    """A `from`/`to` value in epoch seconds; a 400 naming `param` if it is none."""
    if text is None or text == "":
        return None
    bad = InvalidRequest(
        f"`{param}` must be a UTC date (2026-11-28), a time (2026-11-28T13:00) or epoch seconds "
        f"from 0 to {LATEST:.0f}, not {text[:40]!r}.",
        param,
    )
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise bad from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        seconds = when.timestamp()
    if not 0 <= seconds <= LATEST:  # nan, inf, and times a report could not print
        raise bad
    return seconds


def iso(start: int) -> str:
    return dt.datetime.fromtimestamp(start, dt.timezone.utc).isoformat().replace("+00:00", "Z")


def report(rows: list[Row]) -> dict[str, Any]:
    """Rows (start as ISO time), and totals by key and model over them."""
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        t = totals.setdefault((r.key, r.model), {"key": r.key, "model": r.model, **{c: 0 for c in COUNTS}})
        for c in COUNTS:
            t[c] += getattr(r, c)
    return {
        "rows": [{**asdict(r), "start": iso(r.start)} for r in rows],
        "totals": sorted(totals.values(), key=lambda t: (t["key"], t["model"])),
    }


def as_csv(rows: list[Row]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(FIELDS)
    for r in rows:
        w.writerow([*(iso(r.start) if f == "start" else getattr(r, f) for f in FIELDS)])
    return out.getvalue()


def register(app: QuartTrio) -> None:
    @app.get("/admin/usage")
    async def usage() -> Response:
        args = request.args
        by = args.get("by", "hour")
        if by not in ("hour", "day"):
            raise InvalidRequest(f'`by` must be "hour" or "day", not {by!r}.', "by")
        fmt = args.get("format") or ("csv" if "text/csv" in request.headers.get("accept", "") else "json")
        if fmt not in ("json", "csv"):
            raise InvalidRequest(f'`format` must be "json" or "csv", not {fmt!r}.', "format")
        since, until = instant(args.get("from"), "from"), instant(args.get("to"), "to")
        key, model = args.get("key"), args.get("model")
        ledger = of(app).ledger

        def read(store: UsageStore) -> list[Row]:
            return store.rows("day" if by == "day" else "hour", since, until, key, model)

        rows = await ledger.ask(read)
        if fmt == "csv":
            return Response(as_csv(rows), content_type="text/csv; charset=utf-8")
        body = {
            "object": "usage", "by": by,
            "from": None if since is None else iso(int(since)), "to": None if until is None else iso(int(until)),
            "ledger": str(ledger.path) if ledger.path is not None else None,
            **report(rows),
        }
        return Response(_json.encode(body), content_type="application/json")
