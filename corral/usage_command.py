"""`corral usage`: the usage ledger of a running server, in the terminal (GET /admin/usage).

  corral usage                      totals by key and model, everything the ledger keeps
  corral usage --by day --from 2026-11-01
                                    a row per UTC day, key and model
  corral usage --key alice --csv    the rows as CSV, for a spreadsheet

Takes the options of `corral status` (--url, --config, --admin-key-file, --timeout).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import urllib.parse
from typing import TYPE_CHECKING, Any

from corral import admin_target as at
from corral.admin_commands import Server, common_options, run_with_server

if TYPE_CHECKING:
    from corral.args import Subparsers

COLUMNS = (
    ("KEY", "key"), ("MODEL", "model"), ("REQUESTS", "requests"), ("PROMPT", "prompt_tokens"),
    ("CACHED", "cached_tokens"), ("GENERATED", "generated_tokens"), ("ERRORS", "errors"),
)


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "usage", help="show who used how much of the running server (its usage ledger)",
        description=__doc__, parents=[common_options()], epilog=at.EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--key", help="one key, by its name")
    p.add_argument("--model", help="one model")
    p.add_argument("--from", dest="since", metavar="WHEN", help="a UTC date (2026-11-28), a time, or epoch seconds")
    p.add_argument("--to", dest="until", metavar="WHEN", help="the end, exclusive (same forms as --from)")
    p.add_argument("--by", choices=["hour", "day"], help="a row per hour or day, not totals")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--csv", action="store_true", help="the rows as CSV (by hour unless --by day)")
    how.add_argument("--json", action="store_true", help="GET /admin/usage's JSON as it is")
    p.set_defaults(run=usage, default_timeout=30)


def query(args: argparse.Namespace) -> str:
    params = {
        k: v for k, v in (
            ("key", args.key), ("model", args.model), ("from", args.since), ("to", args.until), ("by", args.by or "hour"),
        ) if v is not None
    }
    return "/admin/usage?" + urllib.parse.urlencode(params)


def table(rows: list[dict[str, Any]], columns: tuple[tuple[str, str], ...]) -> str:
    """Rows under their headers, numbers right-aligned, a key without a name as "-"."""
    cells = [[h for h, _ in columns]] + [
        [("-" if r[f] == "" else str(r[f])) for _, f in columns] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for row in cells:
        lines.append("  ".join(c.ljust(w) if i < 2 or not c.isdigit() else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines)


def usage(args: argparse.Namespace) -> int:
    def run(server: Server, args: argparse.Namespace) -> int:
        body = server.admin("GET", query(args))
        if args.json:
            print(json.dumps(body, indent=2))
        elif args.csv:
            rows = body["rows"]
            w = csv.writer(sys.stdout, lineterminator="\n")
            fields = list(rows[0]) if rows else ["period", "start", "key", "model"]
            w.writerow(fields)
            for r in rows:
                w.writerow([r[f] for f in fields])
        elif args.by:
            print(table(body["rows"], (("START", "start"), *COLUMNS)) if body["rows"] else "no usage in that range")
        else:
            print(table(body["totals"], COLUMNS) if body["totals"] else "no usage in that range")
        return at.OK

    return run_with_server(args, run)
