"""Issue 44, items 1 and 2, on the demo model: the usage ledger counts what the clients saw,
over every dialect, and keeps it across a restart; each quota answers the official clients'
429 with the headers they read, and they retry as Retry-After says.

Where the behaviour comes from: OpenAI's rate-limit headers (`x-ratelimit-*`, platform docs
"Rate limits"), Anthropic's (`anthropic-ratelimit-*`, API reference "Rate limits"); both
SDKs retry a 429 after `retry-after-ms`/`retry-after` (openai/_base_client.py,
anthropic/_base_client.py `_calculate_retry_timeout`).
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.e2e.conftest import CHECKOUT_CORRAL, DEMO_MODEL, Server, start_server, stop_server
from tests.secrets import secret

ALICE, BOB, CAROL, DAVE, ERIN, ADMIN = (
    secret(n) for n in ("use-alice", "use-bob", "use-carol", "use-dave", "use-erin", "use-admin")
)

CONFIG = f"""
[server]
port = {{PORT}}
state_dir = "state"
public_metrics = true
api_keys = [
  {{ key = "{ALICE}", name = "alice" }},
  {{ key = "{BOB}", name = "bob", max_in_flight = 1 }},
  {{ key = "{CAROL}", name = "carol", requests_per_minute = 2 }},
  {{ key = "{DAVE}", name = "dave", tokens_per_day = 40 }},
  {{ key = "{ERIN}", name = "erin", tokens_per_minute = 30 }},
]
admin_keys = ["{ADMIN}"]

[models.gemma]
path = "{{MODEL}}"
chat_template = "gemma"
slots = 2
n_ctx = 1024

# A model served elsewhere (nothing listens there): a key's quotas are checked before any
# request is relayed.
[models.remote]
upstream = "http://127.0.0.1:9"
"""

HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("usage")


@pytest.fixture(scope="module")
def server(tmp: Path) -> Iterator[Server]:
    srv = start_server(tmp, CONFIG)
    yield srv
    stop_server(srv)


def usage(srv: Server, **params: str) -> dict[str, Any]:
    r = httpx.get(srv.url + "/admin/usage", params=params, headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def totals(srv: Server, key: str, until: int | None = None) -> dict[str, int]:
    """The ledger's totals for `key` (waiting, briefly, for `until` requests to be in)."""
    deadline = time.monotonic() + 10
    while True:
        # (a request refused by a quota before it named its model is counted under model "")
        rows = usage(srv, key=key)["totals"]
        got = {c: sum(t[c] for t in rows) for c in ("requests", "prompt_tokens", "cached_tokens", "generated_tokens", "errors")}
        if until is None or got["requests"] >= until or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_the_ledger_counts_what_each_dialect_told_its_client(server: Server) -> None:
    prompt = generated = cached = 0
    oa = openai.OpenAI(base_url=server.base, api_key=ALICE, max_retries=0)
    whole = oa.chat.completions.create(model="gemma", messages=HI, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    assert whole.usage is not None
    prompt, generated = prompt + whole.usage.prompt_tokens, generated + whole.usage.completion_tokens
    cached += whole.usage.prompt_tokens_details.cached_tokens if whole.usage.prompt_tokens_details else 0
    stream = oa.chat.completions.create(
        model="gemma", messages=HI, max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True},  # type: ignore[arg-type]
    )
    last = [c for c in stream][-1]
    assert last.usage is not None
    prompt, generated = prompt + last.usage.prompt_tokens, generated + last.usage.completion_tokens
    cached += last.usage.prompt_tokens_details.cached_tokens if last.usage.prompt_tokens_details else 0
    text = oa.completions.create(model="gemma", prompt="Once upon a time", max_tokens=5, temperature=0)
    assert text.usage is not None
    prompt, generated = prompt + text.usage.prompt_tokens, generated + text.usage.completion_tokens
    cached += text.usage.prompt_tokens_details.cached_tokens if text.usage.prompt_tokens_details else 0
    an = anthropic.Anthropic(base_url=server.url, api_key=ALICE, max_retries=0)
    msg = an.messages.create(model="gemma", max_tokens=7, messages=[{"role": "user", "content": "Say hello."}])
    read = msg.usage.cache_read_input_tokens or 0
    # Anthropic's input_tokens leave out the tokens read from the cache
    prompt, generated, cached = prompt + msg.usage.input_tokens + read, generated + msg.usage.output_tokens, cached + read
    ol = ollama.Client(host=server.url, headers={"authorization": f"Bearer {ALICE}"})
    chat = ol.chat(model="gemma", messages=HI, options={"num_predict": 4, "temperature": 0})
    prompt, generated = prompt + (chat.prompt_eval_count or 0), generated + (chat.eval_count or 0)
    resp = oa.responses.create(model="gemma", input="Say hello.", max_output_tokens=6)
    assert resp.usage is not None
    prompt, generated = prompt + resp.usage.input_tokens, generated + resp.usage.output_tokens
    cached += resp.usage.input_tokens_details.cached_tokens if resp.usage.input_tokens_details else 0
    native = httpx.post(
        server.url + "/completion", json={"model": "gemma", "prompt": "Once upon a time", "n_predict": 4},
        headers={"authorization": f"Bearer {ALICE}"}, timeout=60,
    ).json()
    prompt, generated = prompt + native["tokens_evaluated"], generated + native["tokens_predicted"]
    cached += native.get("tokens_cached", 0)
    # Failed requests: errors, no tokens, in two dialects.
    with pytest.raises(openai.BadRequestError):
        oa.chat.completions.create(model="gemma", messages=HI, max_tokens=8, temperature=-1)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError):
        an.messages.create(model="gemma", max_tokens=-5, messages=[{"role": "user", "content": "hi"}])
    got = totals(server, "alice", until=9)
    assert got["requests"] == 9 and got["errors"] == 2
    assert got["generated_tokens"] == generated
    assert got["prompt_tokens"] == prompt
    # Ollama's reply says no cached count; the ledger's is at least what the others said
    assert got["cached_tokens"] >= cached


def test_a_stream_the_client_left_counts_the_tokens_it_was_sent(server: Server) -> None:
    before = totals(server, "alice")
    body = {"model": "gemma", "prompt": "Count: 1, 2, 3,", "max_tokens": 200, "ignore_eos": True, "stream": True, "temperature": 0}
    seen = 0
    with httpx.stream("POST", server.base + "/completions", json=body, headers={"authorization": f"Bearer {ALICE}"}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen == 5:
                    break
    got = totals(server, "alice", until=before["requests"] + 1)
    assert got["requests"] == before["requests"] + 1 and got["errors"] == before["errors"]
    counted = got["generated_tokens"] - before["generated_tokens"]
    # What it was sent, and at most what the worker had made before the router saw it go:
    # a cut stream is counted, not lost, and never as its max_tokens.
    assert seen <= counted < 200, (seen, counted)


def test_each_quota_is_a_429_the_openai_client_reads(server: Server) -> None:
    oa = openai.OpenAI(base_url=server.base, api_key=CAROL, max_retries=0)
    for _ in range(2):
        ok = oa.chat.completions.with_raw_response.create(model="gemma", messages=HI, max_tokens=1)  # type: ignore[arg-type]
        assert int(ok.headers["x-ratelimit-limit-requests"]) == 2
    with pytest.raises(openai.RateLimitError) as err:
        oa.chat.completions.create(model="gemma", messages=HI, max_tokens=1)  # type: ignore[arg-type]
    h = err.value.response.headers
    assert h["x-ratelimit-remaining-requests"] == "0"
    assert 1 <= int(h["retry-after"]) <= 60 and int(h["retry-after-ms"]) <= 60_000
    assert err.value.code == "rate_limit_exceeded" and "requests_per_minute" in err.value.message
    # The anthropic client, on its own route, reads Anthropic's headers and error shape.
    an = anthropic.Anthropic(base_url=server.url, api_key=CAROL, max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as aerr:
        an.messages.create(model="gemma", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    assert aerr.value.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert aerr.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    # Ollama's client raises its ResponseError with the status.
    ol = ollama.Client(host=server.url, headers={"authorization": f"Bearer {CAROL}"})
    with pytest.raises(ollama.ResponseError) as oerr:
        ol.chat(model="gemma", messages=HI, options={"num_predict": 1})
    assert oerr.value.status_code == 429 and "requests_per_minute" in str(oerr.value.error)
    # The same quota holds for a model served elsewhere: refused here, never relayed.
    with pytest.raises(openai.RateLimitError) as rerr:
        oa.chat.completions.create(model="remote", messages=HI, max_tokens=1)  # type: ignore[arg-type]
    assert "requests_per_minute" in rerr.value.message
    assert totals(server, "carol")["errors"] >= 3


def test_tokens_per_minute_is_a_429_once_the_minute_holds_them(server: Server) -> None:
    oa = openai.OpenAI(base_url=server.base, api_key=ERIN, max_retries=0)
    first = oa.completions.with_raw_response.create(model="gemma", prompt="Once upon a time", max_tokens=40, temperature=0)
    assert first.headers["x-ratelimit-limit-tokens"] == "30"
    used = first.parse().usage
    assert used is not None and used.total_tokens > 30
    with pytest.raises(openai.RateLimitError) as err:
        oa.completions.create(model="gemma", prompt="Again", max_tokens=1)
    assert "tokens_per_minute" in err.value.message
    h = err.value.response.headers
    assert h["x-ratelimit-remaining-tokens"] == "0"
    # The wait named is until the tokens leave the minute: under 60 s, and not at once.
    assert 1 <= int(h["retry-after"]) <= 60


def _hold(server: Server, key: str, tokens: int, started: threading.Event) -> None:
    body = {"model": "gemma", "prompt": "Count:", "max_tokens": tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.base + "/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=60) as r:
        for _ in r.iter_lines():
            started.set()


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_the_official_clients_wait_as_retry_after_says_and_then_get_through(server: Server, sdk: str) -> None:
    started = threading.Event()
    holder = threading.Thread(target=_hold, args=(server, BOB, 30, started))
    holder.start()
    assert started.wait(30)
    t0 = time.monotonic()
    if sdk == "openai":
        raw = openai.OpenAI(base_url=server.base, api_key=BOB, max_retries=10).chat.completions.with_raw_response.create(
            model="gemma", messages=HI, max_tokens=1,  # type: ignore[arg-type]
        )
        retries = int(raw.http_request.headers.get("x-stainless-retry-count", "0"))
    else:
        araw = anthropic.Anthropic(base_url=server.url, api_key=BOB, max_retries=10).messages.with_raw_response.create(
            model="gemma", max_tokens=1, messages=[{"role": "user", "content": "hi"}]
        )
        retries = int(araw.http_request.headers.get("x-stainless-retry-count", "0"))
    waited = time.monotonic() - t0
    holder.join()
    # Refused while the first was in flight (max_in_flight = 1), then let through after
    # the wait the 429 named (1 s), not the SDK's own backoff of under a second.
    assert retries >= 1 and waited >= 0.9, (retries, waited)


def test_metrics_carry_per_key_series(server: Server) -> None:
    text = httpx.get(server.url + "/metrics", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30).text
    assert 'corral_key_requests_total{key="alice",model="gemma"}' in text
    assert 'corral_key_quota_refusals_total{key="carol",limit="requests_per_minute"}' in text
    assert 'corral_key_in_flight{key="bob"} 0.0' in text
    # /metrics is public here (public_metrics), but who uses how much is an admin key's to see.
    anonymous = httpx.get(server.url + "/metrics", timeout=30)
    assert anonymous.status_code == 200 and "corral_requests_total" in anonymous.text
    assert "corral_key_" not in anonymous.text
    with_a_key = httpx.get(server.url + "/metrics", headers={"authorization": f"Bearer {ALICE}"}, timeout=30).text
    assert "corral_key_" not in with_a_key


def test_usage_as_csv_by_day_and_a_bad_parameter_named(server: Server) -> None:
    r = httpx.get(server.url + "/admin/usage", params={"by": "day", "format": "csv"}, headers={"authorization": f"Bearer {ADMIN}"})
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert r.headers["content-type"].startswith("text/csv")
    assert {row["key"] for row in rows} >= {"alice", "carol"} and all(row["period"] == "day" for row in rows)
    bad = httpx.get(server.url + "/admin/usage", params={"from": "yesterday"}, headers={"authorization": f"Bearer {ADMIN}"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "from"
    alice = httpx.get(server.url + "/admin/usage", headers={"authorization": f"Bearer {ALICE}"})
    assert alice.status_code == 403  # a key's own usage is not yet its to read: an operator's route


def test_corral_usage_prints_the_ledger_in_the_terminal(server: Server) -> None:
    env = {**os.environ, "CORRAL_ADMIN_KEY": ADMIN}
    out = subprocess.run(
        [*CHECKOUT_CORRAL, "usage", "--url", server.url, "--key", "alice"], env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    header, *lines = out.stdout.splitlines()
    assert header.split()[:3] == ["KEY", "MODEL", "REQUESTS"]
    row = next(line.split() for line in lines if line.split()[:2] == ["alice", "gemma"])
    assert int(row[2]) == next(t["requests"] for t in usage(server, key="alice")["totals"] if t["model"] == "gemma")
    as_csv = subprocess.run(
        [*CHECKOUT_CORRAL, "usage", "--url", server.url, "--by", "day", "--csv"], env=env, capture_output=True, text=True, timeout=60,
    )
    assert as_csv.returncode == 0 and "alice" in as_csv.stdout
    assert next(csv.DictReader(io.StringIO(as_csv.stdout)))["period"] == "day"
    refused = subprocess.run(
        [*CHECKOUT_CORRAL, "usage", "--url", server.url], env={**os.environ, "CORRAL_ADMIN_KEY": ALICE},
        capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode != 0 and "admin key" in refused.stderr


def test_tokens_per_day_and_the_ledger_survive_a_restart(server: Server, tmp: Path) -> None:
    oa = openai.OpenAI(base_url=server.base, api_key=DAVE, max_retries=0)
    oa.completions.create(model="gemma", prompt="Once upon a time there was", max_tokens=40, temperature=0)
    with pytest.raises(openai.RateLimitError) as err:
        oa.completions.create(model="gemma", prompt="Again", max_tokens=1)
    assert "tokens_per_day" in err.value.message
    before = totals(server, "alice")
    stop_server(server)
    again = start_server(tmp, CONFIG)
    try:
        assert totals(again, "alice") == before
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=again.base, api_key=DAVE, max_retries=0).completions.create(
                model="gemma", prompt="Again", max_tokens=1
            )
        assert (tmp / "state" / "usage.sqlite3").is_file()
    finally:
        stop_server(again)


@pytest.mark.parametrize("where", ["unwritable", "not-a-ledger"])
def test_a_state_dir_that_cannot_hold_the_ledger_is_a_clear_start_error(tmp_path: Path, where: str) -> None:
    state = "/proc/corral-no-such" if where == "unwritable" else "state"
    if where == "not-a-ledger":
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "usage.sqlite3").write_text("not a database\\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[server]\nport = 1\nstate_dir = "{state}"\n[models.gemma]\npath = "{DEMO_MODEL}"\n')
    out = subprocess.run([*CHECKOUT_CORRAL, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "server.state_dir: cannot keep the usage ledger" in out.stderr and "Traceback" not in out.stderr
