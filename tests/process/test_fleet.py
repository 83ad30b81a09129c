"""The fleet (issue 25, item 4: "`corral status --url A --url B` and the dashboard can show
several hosts"): a front whose [server] fleet names another Corral server, one that is
not there and one that answers something else. GET /admin/fleet asks each at once, with
the fleet's key; `corral status --fleet` prints them in one table with the front's own."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio

from supervisor.config import parse
from supervisor.supervisor import Supervisor
from tests.process.support import WORKER_COMMAND, corral, serving_http
from tests.secrets import secret

BACK_ADMIN = secret("back-admin")
# Models served elsewhere only: no worker starts, so the servers cost nothing to run.
BACK = f"""
[server]
admin_keys = ["{BACK_ADMIN}"]

[models.far]
upstream = "http://127.0.0.1:9/v1"
"""


@pytest.mark.trio
async def test_the_front_shows_its_fleet_and_says_why_a_server_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_FLEET_KEY", BACK_ADMIN)
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    dead = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
    await listener.aclose()  # nothing listens there now
    async with serving_http(Supervisor(parse(BACK, tmp_path), worker_command=WORKER_COMMAND)) as back:
        front_cfg = parse(f'[server]\nfleet = ["{back}", "{dead}"]\nfleet_key_env = "CORRAL_TEST_FLEET_KEY"\n'
                          '[models.near]\nupstream = "http://127.0.0.1:9/v1"\n', tmp_path)
        async with serving_http(Supervisor(front_cfg, worker_command=WORKER_COMMAND)) as front:
            async with httpx.AsyncClient(timeout=30) as c:
                hosts = (await c.get(front + "/admin/fleet")).json()["hosts"]
            done = await corral("status", "--fleet", "--url", front, cwd=tmp_path)
            as_json = await corral("status", "--fleet", "--json", "--url", front, cwd=tmp_path)
    assert [h["url"] for h in hosts] == [back, dead]
    (far,) = hosts[0]["upstreams"]
    assert far["name"] == "far" and hosts[0]["models"] == []
    assert "cannot reach it" in hosts[1]["error"]
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr
    # The front's own model and the back's, each named by its host; the missing one above.
    assert front.split("://")[1] + ": upstream near" in out and back.split("://")[1] + ": upstream far" in out
    assert dead.split("://")[1] + ": cannot reach it" in out
    listed = json.loads(as_json.stdout)["hosts"]
    assert [h["url"] for h in listed] == [front, back, dead] and "error" in listed[2]


@pytest.mark.trio
async def test_a_fleet_key_the_servers_refuse_is_named_in_the_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_FLEET_KEY", "not-" + BACK_ADMIN)
    async with serving_http(Supervisor(parse(BACK, tmp_path), worker_command=WORKER_COMMAND)) as back:
        front_cfg = parse(f'[server]\nfleet = ["{back}"]\nfleet_key_env = "CORRAL_TEST_FLEET_KEY"\n'
                          '[models.near]\nupstream = "http://127.0.0.1:9/v1"\n', tmp_path)
        async with serving_http(Supervisor(front_cfg, worker_command=WORKER_COMMAND)) as front:
            async with httpx.AsyncClient(timeout=30) as c:
                (host,) = (await c.get(front + "/admin/fleet")).json()["hosts"]
    assert host["url"] == back and "answered 401" in host["error"] and "fleet_key_env" in host["error"]
