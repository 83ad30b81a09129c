"""The dashboard of a front whose models are served elsewhere (issue 25, item 4): headless
Chromium against a `corral serve` front with one upstream model on two replicas, a real
back and an address where nothing listens. The page lists each replica, in rotation or
out of it with the reason, and chats with the upstream model through the front. The
same two are the front's fleet: its table shows the back's models, and the other as not
answering."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.e2e.cdp import Chromium
from tests.e2e.conftest import Server, free_port, start_server, stop_server
from tests.e2e.test_balancers import BACKEND

pytestmark = pytest.mark.model

# The balancers' back (the demo model as `demo`); the dashboard's chat sets no limit.
BACK = BACKEND + "max_tokens = 16\n"

FRONT = """
[server]
port = {PORT}
fleet = ["%s", "%s"]

[supervisor]
health_interval = 0.5

[models.far]
upstream = ["%s", "%s"]
upstream_model = "demo"
"""


@pytest.fixture
def front_and_back(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server, str]]:
    back = start_server(tmp_path_factory.mktemp("back"), BACK)
    dead_root = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    dead = dead_root + "/v1"
    front = start_server(tmp_path_factory.mktemp("front"), FRONT % (back.url, dead_root, back.base, dead))
    try:
        yield front, back, dead
    finally:
        stop_server(front)
        stop_server(back)


def test_the_dashboard_shows_each_replica_and_chats_through_the_front(
    front_and_back: tuple[Server, Server, str], tmp_path: Path
) -> None:
    front, back, dead = front_and_back
    with Chromium(tmp_path / "profile") as page:
        page.navigate(front.url + "/")  # loopback, no admin key configured: no key asked
        page.wait_for("document.querySelectorAll('#upstreams tr').length === 2", 30, "a row per replica")
        rows = "[...document.querySelectorAll('#upstreams tr')].map(r => [...r.cells].map(c => c.textContent))"
        page.wait_for(f"{rows}.some(r => r[2] === 'out of rotation')", 30, "the dead replica out of rotation")
        by_url = {r[1]: r for r in page.evaluate(rows)}
        assert by_url[back.base][:3] == ["far (demo there)", back.base, "in rotation"]
        assert by_url[dead][2] == "out of rotation" and "connect" in by_url[dead][5]
        assert page.evaluate("document.getElementById('upstream-section').hidden") is False
        # The upstream model is in the chat's list, and a reply streams in through the front.
        page.wait_for("[...document.getElementById('chat-model').options].some(o => o.value === 'far')", 30, "far to chat with")
        page.evaluate("document.getElementById('chat-model').value = 'far'")
        page.type_into("#chat-input", "Say hello.")
        page.click("#chat-send")
        page.wait_for(
            "document.querySelectorAll('#chat-log .msg').length === 2 && document.getElementById('chat-send').disabled === false",
            120, "the reply",
        )
        assert page.evaluate("document.querySelector('#chat-log .msg.assistant').classList.contains('error')") is False
        assert page.evaluate("document.querySelector('#chat-log .msg.assistant span').textContent").strip()
        page.wait_for(f"{rows}.some(r => r[1] === {back.base!r} && r[4].startsWith('1 ok'))", 30, "the request counted")
        fleet = "[...document.querySelectorAll('#fleet tr')].map(r => [...r.cells].map(c => c.textContent))"
        page.wait_for(f"{fleet}.length === 2", 30, "the fleet: the back's model, and the host that is not there")
        (back_row, dead_row) = page.evaluate(fleet)
        dead_root = dead.removesuffix("/v1")
        assert back_row[:2] == [back.url.split("://")[1], "demo"] and back_row[2] in ("ready", "stopped", "starting")
        assert back_row[3].endswith("/ 2")
        assert dead_row[0] == dead_root.split("://")[1] and dead_row[2] == "not answering" and "cannot reach" in dead_row[5]
        assert page.problems == []
