"""The dashboard in headless Chromium against the real app and supervisor with fake
workers: what the demo model cannot be made to do on demand (a failed load, a slow stream to
stop, a refusal held back by the network). The real model: tests/e2e/test_dashboard_browser.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from supervisor.config import Config, parse
from supervisor.supervisor import Supervisor
from tests.e2e.cdp import Chromium
from tests.harness import config_text, write_gguf
from tests.process.support import WORKER_COMMAND, make_supervisor, serving_http
from tests.secrets import secret

# Markup in an error message must show as text: a worker's message is not the page's HTML.
FAILURE = 'disk on fire <img src=x onerror="document.title=1">'


def row(model: str, cell: str) -> str:
    return f"((document.querySelector('tr[data-model={json.dumps(model)}] td.{cell}') || {{}}).textContent || '')"


def button(model: str, action: str) -> str:
    return f"tr[data-model={json.dumps(model)}] button[data-action={action}]"


def disabled(model: str, action: str) -> str:
    return f"document.querySelector({json.dumps(button(model, action))}).disabled"


async def test_failed_load_shows_its_error_and_reset_clears_it_and_stop_ends_a_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAIL_LOAD__broken", FAILURE)
    monkeypatch.setenv("FAKE_TOKENS_PER_SEC__slow", "8")  # a reply that takes a while
    sup = make_supervisor(
        tmp_path, {"slow": {"slots": 2}, "broken": {}}, start_retries=0, backoff_base=0.1
    )

    def drive(url: str) -> None:
        with Chromium(tmp_path / "profile") as page:
            page.navigate(url + "/")
            # On loopback with no admin key configured (corral serve's default): no prompt.
            page.wait_for("document.querySelectorAll('#models tr').length === 2", 30, "the rows")
            assert page.evaluate("document.getElementById('key-dialog').open") is False

            # A failed load: the state, the worker's message as text, and only Reset offered.
            page.click(button("broken", "load"))
            page.wait_for(f"{row('broken', 'state')} === 'failed'", 30, "the load to fail")
            page.wait_for(f"{row('broken', 'error')}.includes('disk on fire')", 30, "the error")
            assert FAILURE in page.evaluate(row("broken", "error"))
            assert page.evaluate("document.querySelectorAll('#models img').length") == 0
            assert page.evaluate("document.title") == "Corral"
            assert page.evaluate(disabled("broken", "load")) is True
            assert page.evaluate(disabled("broken", "reset")) is False
            page.click(button("broken", "reset"))
            page.wait_for(f"{row('broken', 'state')} === 'stopped'", 30, "the reset")
            assert page.evaluate(disabled("broken", "reset")) is True
            assert page.evaluate(disabled("broken", "load")) is False

            # A chat loads its model on demand; Stop ends the stream and frees the slot.
            page.evaluate("document.getElementById('chat-model').value = 'slow'")
            page.evaluate("document.getElementById('max-tokens').value = '400'")
            page.type_into("#chat-input", "hello")
            page.click("#chat-send")
            page.wait_for(
                "document.querySelector('#chat-log .msg.assistant span').textContent.includes('tok3')",
                30, "the reply to start",
            )
            page.wait_for(f"{row('slow', 'slots')} === '1 / 2'", 30, "the busy slot")
            page.wait_for(f"{row('slow', 'state')} === 'ready'", 30, "the model ready")
            page.click("#chat-stop")
            page.wait_for(
                "document.querySelector('#chat-log .msg.assistant').textContent.includes('[stopped]')",
                30, "the reply to stop",
            )
            page.wait_for(f"{row('slow', 'slots')} === '0 / 2'", 30, "the slot to be freed")
            assert page.evaluate("document.getElementById('chat-send').disabled") is False
            # The stop left the question out of the conversation: the next turn is clean.
            assert page.evaluate("history.length") == 0
            problems = [p for p in page.problems if "503" not in p]  # the failed load's answer
            assert problems == []

    with trio.fail_after(120):
        async with serving_http(sup) as url:
            await trio.to_thread.run_sync(drive, url)


# Holds back every 401 of GET /admin/models, so that the page's first poll is refused only
# after the key has been entered: the order a slow network can give.
LATE_REFUSALS = """
window.lateRefusals = 0;
const realFetch = window.fetch;
window.fetch = async (...args) => {
  const resp = await realFetch(...args);
  if (resp.status === 401 && String(args[0]).endsWith("admin/models")) {
    await new Promise((ok) => setTimeout(ok, 1500));
    window.lateRefusals++;
  }
  return resp;
};
"""


async def test_a_refusal_that_arrives_after_the_key_was_entered_does_not_ask_again(tmp_path: Path) -> None:
    admin = secret("admin")
    write_gguf(tmp_path / "dummy.gguf")
    cfg = parse(config_text({"a": {}}, {"admin_keys": [admin]}), tmp_path)
    sup = Supervisor(Config(cfg.server, cfg.supervisor, cfg.models, None, cfg.keys), worker_command=WORKER_COMMAND)

    def drive(url: str) -> None:
        with Chromium(tmp_path / "profile") as page:
            page.add_init_script(LATE_REFUSALS)
            page.navigate(url + "/")
            page.wait_for("document.getElementById('key-dialog').open", 30, "the key prompt")
            page.type_into("#key-input", admin)
            page.click("#key-form button[type=submit]")
            page.wait_for("window.lateRefusals >= 1", 30, "the late refusal")
            page.wait_for("document.querySelectorAll('#models tr').length === 1", 30, "the row")
            assert page.evaluate("document.getElementById('key-dialog').open") is False
            page.wait_for("document.getElementById('conn').textContent === 'live'", 30, "the event stream")

    with trio.fail_after(120):
        async with serving_http(sup) as url:
            await trio.to_thread.run_sync(drive, url)
