"""The usage ledger and the quotas, on the app: the hooks that count and refuse.

- Before a route runs (after the key check, before a request is relayed to an upstream, so
  that the same quotas reach models served elsewhere): a POST of a key with quotas is
  admitted or refused with a 429 in its dialect's shape (router/usage/quotas.py). Only
  POSTs count: they are what generates, embeds or tokenizes; listing models is free.
- After it: a key with quotas gets its rate-limit headers, on errors too (headers.py).
- When the answer is done (access_log's DONE hooks, on the event loop, never blocking):
  the request goes to the ledger's queue (ledger.py), its tokens are charged to its key's
  quotas, and its per-key counters move for /metrics.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from quart import Response, g, request
from quart_trio import QuartTrio

from router.server import access_log
from router.server.access_log import Record
from router.server.auth import current_key
from router.usage import entries, headers
from router.usage.entries import Entry, day_of
from router.usage.ledger import Ledger
from router.usage.quotas import QuotaBook
from supervisor.config import Config, ConfigError
from supervisor.errors import QuotaExceeded
from supervisor.supervisor import Supervisor

log = logging.getLogger("corral.usage")
EXTENSION = "corral.usage"
LEDGER_FILE = "usage.sqlite3"


class Usage:
    """The ledger, the quota book and the counters since start, for one server."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.book = QuotaBook()
        # Since start, by (key name, model): requests, prompt, cached, generated, errors.
        self.totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
        self.refused: dict[tuple[str, str], int] = defaultdict(int)  # (key name, limit)
        now = time.time()
        self.book.seed_day(ledger.ask_now(lambda store: store.tokens_since(day_of(now))), now)

    def finished(self, record: Record) -> None:
        """A DONE hook: one answer is done."""
        if not entries.counted(record):
            return
        entry = entries.of(record, time.time())
        self.ledger.record(entry)
        if record.quota_held and record.key_id is not None:
            self.book.done(record.key_id, entry.tokens, time.monotonic(), entry.at)
        self._count(entry)

    def _count(self, e: Entry) -> None:
        row = self.totals[(e.key, e.model)]
        for i, n in enumerate((1, e.prompt_tokens, e.cached_tokens, e.generated_tokens, int(e.error))):
            row[i] += n


def ledger_path(config: Config) -> Path | None:
    state = config.server.state_dir
    return None if state is None else Path(state) / LEDGER_FILE


def install(app: QuartTrio, supervisor: Supervisor, dialect_of: Callable[[str], str]) -> Usage:
    """Open the ledger (in `[server] state_dir`, or in memory) and hook it in. Call it right
    after the key check is installed."""
    cfg = supervisor.config.server
    path = ledger_path(supervisor.config)
    if path is None and (daily := [k.name for k in supervisor.config.keys.keys if k.rules.tokens_per_day is not None]):
        log.warning(
            "%s set tokens_per_day, and the usage ledger is kept in memory: a restart starts their day "
            "afresh. Set [server] state_dir to keep it.", ", ".join(daily),
        )
    try:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        ledger = Ledger(path, cfg.usage_hourly_for, cfg.usage_daily_for)
    except (OSError, sqlite3.Error, RuntimeError) as exc:  # a folder it may not write, a file not a ledger
        raise ConfigError([f"server.state_dir: cannot keep the usage ledger at {path}: {exc}"]) from None
    usage = Usage(ledger)
    app.extensions[EXTENSION] = usage
    app.extensions.setdefault(access_log.DONE_HOOKS, []).append(usage.finished)

    @app.before_request
    async def check_quota() -> None:
        key = current_key()
        # (the record releases what is admitted, when the answer is done: no record, no count)
        record = access_log.current()
        if key is None or record is None or request.method != "POST" or not key.rules.limited:
            return
        refusal = usage.book.admit(key.owner, key.rules, time.monotonic(), time.time())
        g.corral_quota = key
        if refusal is not None:
            usage.refused[(key.name, refusal.limit)] += 1
            raise QuotaExceeded(refusal.message, refusal.retry_after, refusal.limit)
        record.quota_held = True

    @app.after_request
    async def rate_limit_headers(response: Response) -> Response:
        key = g.get("corral_quota")
        if key is not None:
            wall = time.time()
            standing = usage.book.standing(key.owner, key.rules, time.monotonic(), wall)
            family = headers.anthropic(standing, wall) if dialect_of(request.path) == "anthropic" else headers.openai(standing)
            response.headers.update(family)
        return response

    return usage


def of(app: QuartTrio) -> Usage:
    usage: Usage = app.extensions[EXTENSION]
    return usage


class UsageCollector(Collector):
    """Per-key series in /metrics, for an admin key's scrape (with keys configured). Keys
    are configured, so the label set is bounded (by the keys configured since start: a
    reload that drops one keeps its counts until a restart, as counters must)."""

    def __init__(self, usage: Usage, supervisor: Supervisor) -> None:
        self._usage = usage
        self._supervisor = supervisor

    def collect(self) -> Iterable[Metric]:
        ring = self._supervisor.config.keys
        scraper = current_key()
        if (ring.api_keys_required or ring.admin_keys_configured) and (scraper is None or not scraper.admin):
            # An anonymous scrape of a public /metrics (public_metrics): who uses how much
            # is the operator's to see, not every client's.
            return
        names = ("requests", "prompt_tokens", "prompt_tokens_cached", "generation_tokens", "errors")
        helps = (
            "Requests answered, by key and model.", "Prompt tokens (cached included), by key and model.",
            "Prompt tokens served from the prefix cache, by key and model.", "Tokens generated, by key and model.",
            "Requests that ended in an error (a status of 400 or more), by key and model.",
        )
        families = [
            CounterMetricFamily(f"corral_key_{n}", h, labels=["key", "model"]) for n, h in zip(names, helps)
        ]
        for (key, model), row in sorted(self._usage.totals.items()):
            for family, n in zip(families, row):
                family.add_metric([key, model], float(n))
        refused = CounterMetricFamily(
            "corral_key_quota_refusals", "Requests refused by a key's quota, by key and limit.", labels=["key", "limit"]
        )
        for (key, limit), n in sorted(self._usage.refused.items()):
            refused.add_metric([key, limit], float(n))
        in_flight = GaugeMetricFamily("corral_key_in_flight", "Requests in flight of a key with quotas.", labels=["key"])
        today = GaugeMetricFamily(
            "corral_key_tokens_today", "Tokens (prompt and generated) of a key with quotas since 00:00 UTC.", labels=["key"]
        )
        wall = time.time()
        for k in self._supervisor.config.keys.keys:
            if k.rules.limited:
                in_flight.add_metric([k.name], float(self._usage.book.in_flight(k.owner)))
                today.add_metric([k.name], float(self._usage.book.tokens_today(k.owner, wall)))
        yield from (*families, refused, in_flight, today)
