"""Acceptance of the dashboard (issue 12, item 6): headless Chromium against a real
`corral serve` with the demo model, with keys configured. The page opens without a key,
asks for the admin key when its reads are refused, shows the models, loads one and sees it
become ready with no page reload (the event stream), chats with it and sees the reply
stream in, unloads it, and leaves a screenshot in test-artifacts/ to look at."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.e2e.cdp import Chromium
from tests.e2e.conftest import ROOT, Server, start_server, stop_server
from tests.secrets import secret

pytestmark = pytest.mark.model

ADMIN = secret("dashboard-admin")
API = secret("dashboard-api")
ARTIFACTS = ROOT / "test-artifacts"

CONFIG = f"""
[server]
port = {{PORT}}
api_keys = ["{API}"]
admin_keys = ["{ADMIN}"]

[supervisor]
idle_timeout = 0

[models.gemma]
path = "{{MODEL}}"
aliases = ["demo"]
slots = 2
n_ctx = 1024
chat_template = "gemma"
max_tokens = 24

[models.gemma-long]
path = "{{MODEL}}"
slots = 1
n_ctx = 2048
chat_template = "gemma"
"""

# Generous: a cold load and a first reply on a busy 2-core machine take seconds, and every
# wait returns as soon as the page shows what it waits for.
SLOW = 120.0


def row(model: str, cell: str) -> str:
    """JavaScript: the text of one cell of a model's row ('' while there is no row)."""
    return (
        f"((document.querySelector('tr[data-model={json.dumps(model)}] td.{cell}') || {{}}).textContent || '')"
    )


@pytest.fixture
def keyed_server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path, CONFIG)
    yield srv
    stop_server(srv)


def test_dashboard_drives_a_real_model_in_a_browser(keyed_server: Server, tmp_path: Path) -> None:
    with Chromium(tmp_path / "profile") as page:
        try:
            _drive(page, keyed_server)
        except Exception:
            # What the page showed, and why, for whoever reads the failure.
            try:
                print(f"failure screenshot: {page.screenshot(ARTIFACTS / 'dashboard-failure.png')}")
            except Exception as exc:
                print(f"no failure screenshot: {exc}")
            print(f"page problems: {page.problems}\nserver log (end):\n{keyed_server.log_text()[-4000:]}")
            raise


def _drive(page: Chromium, server: Server) -> None:
    page.navigate(server.url + "/")
    # The page loads with no key, its reads are refused, so it asks for one.
    page.wait_for("document.getElementById('key-dialog').open", 30, "the key prompt")
    assert "didn't provide" in page.evaluate("document.getElementById('key-reason').textContent")
    assert page.evaluate("document.querySelectorAll('#models tr').length") == 0
    # A wrong key is refused, and the page asks again, saying so.
    page.type_into("#key-input", secret("wrong"))
    page.click("#key-form button[type=submit]")
    page.wait_for(
        "document.getElementById('key-dialog').open && "
        "document.getElementById('key-reason').textContent.includes('was refused')",
        30, "the key prompt again",
    )
    page.type_into("#key-input", ADMIN)
    page.click("#key-form button[type=submit]")

    # Every model, as the server lists it, stopped.
    page.wait_for("document.querySelectorAll('#models tr').length === 2", 30, "both models' rows")
    assert page.evaluate("[...document.querySelectorAll('#models tr')].map(r => r.dataset.model)") == [
        "gemma", "gemma-long",
    ]
    assert page.evaluate(row("gemma", "state")) == "stopped"
    assert page.evaluate(row("gemma", "slots")) == "0 / 2"
    assert page.evaluate(row("gemma", "name")) == "gemmaaka demo"
    page.wait_for("document.getElementById('conn').textContent === 'live'", 30, "the event stream")
    # The key is kept for the tab, not in the page's address or a cookie.
    assert page.evaluate("document.cookie") == "" and "sk-" not in page.evaluate("location.href")

    # Load: the row goes to ready by itself, through the event stream alone: the
    # page's polling of /admin/models is switched off until after the chat below.
    page.evaluate("window.realPoll = poll; poll = async () => {}; true")
    page.click("tr[data-model=gemma] button[data-action=load]")
    page.wait_for(f"{row('gemma', 'state')} === 'ready'", SLOW, "gemma to become ready")
    assert page.evaluate(row("gemma-long", "state")) == "stopped"
    server_view = httpx.get(
        server.url + "/admin/models/gemma", headers={"authorization": f"Bearer {ADMIN}"}
    ).json()["model"]
    assert server_view["state"] == "ready"

    # Chat: the reply streams into the log.
    page.evaluate("document.getElementById('chat-model').value = 'gemma'")
    page.type_into("#chat-input", "Say hello in three words.")
    # Count the reply's updates on screen: a streamed reply comes in many.
    page.evaluate(
        "window.replyUpdates = 0; new MutationObserver((ms) => { for (const m of ms)"
        " if (m.target.parentElement && m.target.parentElement.classList.contains('assistant'))"
        " window.replyUpdates++; }).observe(document.getElementById('chat-log'),"
        " {childList: true, subtree: true, characterData: true}); true"
    )
    page.click("#chat-send")
    page.wait_for(
        "document.querySelectorAll('#chat-log .msg').length === 2 && "
        "document.getElementById('chat-send').disabled === false",
        SLOW, "the reply to finish",
    )
    reply = page.evaluate("document.querySelector('#chat-log .msg.assistant span').textContent")
    assert page.evaluate("document.querySelector('#chat-log .msg.assistant').classList.contains('error')") is False
    assert reply.strip(), "an empty reply"
    assert page.evaluate("window.replyUpdates") >= 3, "the reply did not stream in"
    assert page.evaluate("document.querySelector('#chat-log .msg.user span').textContent") == (
        "Say hello in three words."
    )
    # Polling stays off until the reply is done, so the page has read the token counter
    # neither before nor during it (as when a short reply falls between two polls): the
    # rate must still show, from the counter's zero when the worker became ready. It
    # shows on the next polls (for a few seconds: the page's window is RATE_WINDOW_MS).
    page.evaluate("poll = window.realPoll; true")
    page.wait_for(f"/ MiB|GiB/.test({row('gemma', 'memory')})", 30, "the worker's memory")
    page.wait_for(f"parseFloat({row('gemma', 'rate')}) > 0", 30, "a tokens-per-second figure")
    # The slot it held is free again, and the page says so by itself.
    page.wait_for(f"{row('gemma', 'slots')} === '0 / 2'", 30, "the slot to be free again")
    tokens = httpx.get(
        server.url + "/admin/models/gemma", headers={"authorization": f"Bearer {ADMIN}"}
    ).json()["model"]["tokens_generated"]
    assert tokens >= 1
    # The usage view (issue 44): the ledger's row for the admin key's chat, and its hour's
    # bar in the chart, equal to what GET /admin/usage says.
    usage_row = "document.querySelector('#usage tr[data-key=\"admin_keys[0]\"][data-model=gemma]')"
    page.wait_for(f"!!{usage_row}", 30, "the chat's row in the usage view")
    ledger = httpx.get(
        server.url + "/admin/usage", params={"key": "admin_keys[0]", "model": "gemma"},
        headers={"authorization": f"Bearer {ADMIN}"},
    ).json()["totals"][0]
    cells = page.evaluate(f"[...{usage_row}.querySelectorAll('td')].map(td => td.textContent)")
    assert cells[:3] == ["admin_keys[0]", "gemma", str(ledger["requests"])]
    assert cells[5] == str(ledger["generated_tokens"]) and int(cells[5]) >= 1
    # Who waits at which priority, as corral status shows it (issue 44).
    assert page.evaluate("byClass({interactive: 1, normal: 0, batch: 5})") == " (i1 b5)"
    assert page.evaluate("byClass({interactive: 0, normal: 3, batch: 0})") == ""
    assert page.evaluate(row("gemma", "queue")) == "0"
    bar = page.evaluate("[...document.querySelectorAll('#usage-chart rect.bar')].map(r => r.dataset.key)")
    assert bar == ["admin_keys[0]"]
    assert "tokens" in page.evaluate("document.querySelector('#usage-chart rect.bar title').textContent")

    shot = page.screenshot(ARTIFACTS / "dashboard-ready.png")
    print(f"dashboard screenshot (model ready, after a chat): {shot}")

    # Unload: the row goes back to stopped with no reload of the page.
    page.click("tr[data-model=gemma] button[data-action=unload]")
    page.wait_for(f"{row('gemma', 'state')} === 'stopped'", SLOW, "gemma to stop")
    assert page.evaluate(row("gemma", "slots")) == "0 / 2"
    shot = page.screenshot(ARTIFACTS / "dashboard-unloaded.png")
    print(f"dashboard screenshot (after unload): {shot}")

    # Nothing went wrong in the page: the key prompt's refused reads aside, no
    # exception, no console error, and no blocked resource (the CSP would say).
    problems = [p for p in page.problems if "401" not in p]
    assert problems == []
    # No reload happened: the chat is still on screen.
    assert page.evaluate("document.querySelectorAll('#chat-log .msg').length") == 2
