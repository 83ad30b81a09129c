"""The dashboard at `/` through the real app and supervisor (fake workers): who may open
the page and who may read what it shows, and the token counter its tokens per second is
taken from. The page in a real browser: tests/e2e/test_dashboard_browser.py."""

from __future__ import annotations

from pathlib import Path

import trio

from router.app import create_app
from supervisor.config import Config, parse
from supervisor.lifecycle import State
from supervisor.supervisor import Supervisor
from tests.harness import config_text, running, write_gguf
from tests.process.support import WORKER_COMMAND, generate, make_supervisor, wait_for
from tests.secrets import secret
from worker.protocol import SamplingParams

API = secret("api")
ADMIN = secret("admin")
REMOTE = {"client": ("10.1.2.3", 40000)}

# What the page's script reads and does: each must refuse a client with no key.
DATA_ROUTES = [
    ("GET", "/admin/models"),
    ("GET", "/admin/events"),
    ("POST", "/admin/models/a/load"),
    ("POST", "/admin/models/a/unload"),
    ("POST", "/admin/models/a/reset"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
]


def _supervisor(tmp_path: Path, **server: object) -> Supervisor:
    write_gguf(tmp_path / "dummy.gguf")
    cfg = parse(config_text({"a": {}}, server), tmp_path)
    return Supervisor(Config(cfg.server, cfg.supervisor, cfg.models, None, cfg.keys), worker_command=WORKER_COMMAND)


async def test_with_keys_the_page_opens_but_its_data_needs_the_key(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, api_keys=[API], admin_keys=[ADMIN])
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(30):
        async with running(sup):
            r = await client.get("/", scope_base=REMOTE)
            assert r.status_code == 200
            assert r.headers["content-type"] == "text/html; charset=utf-8"
            body = await r.get_data()
            assert b"<title>Corral</title>" in body
            # The page is the same for everyone: nothing of the server's in it.
            assert b'"a"' not in body and API.encode() not in body and ADMIN.encode() not in body
            assert "script-src 'sha256-" in r.headers["content-security-policy"]
            assert r.headers["x-content-type-options"] == "nosniff"

            for method, path in DATA_ROUTES:
                r = await client.open(path, method=method, scope_base=REMOTE)
                assert r.status_code == 401, (method, path, r.status_code)
            # An API key is not enough for the admin routes the page reads...
            r = await client.get("/admin/models", headers={"authorization": f"Bearer {API}"}, scope_base=REMOTE)
            assert r.status_code == 403
            # ...the admin key is, and works for chat as well (one key in the page).
            r = await client.get("/admin/models", headers={"authorization": f"Bearer {ADMIN}"}, scope_base=REMOTE)
            assert r.status_code == 200 and [m["name"] for m in (await r.get_json())["models"]] == ["a"]
            r = await client.get("/v1/models", headers={"authorization": f"Bearer {ADMIN}"}, scope_base=REMOTE)
            assert r.status_code == 200
            # Only `/` itself is open: neighbours of it are ordinary unknown routes. (`//`
            # is `/` to Werkzeug, for routing and this check alike: test_http_connections.)
            for path in ("/index.html", "/dashboard.html", "/static/dashboard.html"):
                assert (await client.get(path, scope_base=REMOTE)).status_code == 401, path


async def test_with_api_keys_but_no_admin_key_the_page_opens_and_its_data_says_to_set_admin_keys(
    tmp_path: Path,
) -> None:
    # Issue 40, finding 5: keyless loopback reads ended once API keys exist (on a shared
    # host every local user is loopback); the page shows the 403's words in its key dialog.
    sup = _supervisor(tmp_path, api_keys=[API])
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(30):
        async with running(sup):
            assert (await client.get("/", scope_base=REMOTE)).status_code == 200
            for peer in (REMOTE, {"client": ("127.0.0.1", 40000)}):
                r = await client.get("/admin/models", headers={"authorization": f"Bearer {API}"}, scope_base=peer)
                assert r.status_code == 403
                assert "admin_keys" in (await r.get_json())["error"]["message"]
                r = await client.get("/admin/models", scope_base=peer)
                assert r.status_code == 403
    # With no key configured at all, the page's reads on loopback need nothing.
    sup = _supervisor(tmp_path)
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(30):
        async with running(sup):
            r = await client.get("/admin/models", scope_base={"client": ("127.0.0.1", 40000)})
            assert r.status_code == 200


async def test_only_get_and_head_serve_the_page(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path)
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(30):
        async with running(sup):
            assert (await client.head("/")).status_code == 200
            r = await client.post("/", data=b"x")
            assert r.status_code == 405
            assert (await r.get_json())["error"]["type"] == "invalid_request_error"


async def test_tokens_generated_counts_each_token_as_it_comes(tmp_path: Path) -> None:
    sup = make_supervisor(tmp_path, {"chat": {"slots": 2}})
    with trio.fail_after(30):
        async with running(sup):
            handle = sup.handles["chat"]
            assert handle.statistics().tokens_generated is None  # no worker yet
            async with handle.lease() as conn:
                await generate(conn, max_tokens=5)
                assert handle.statistics().tokens_generated == 5
                # Two at once, in the same steps: each token counts once.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(generate, conn, 3)
                    nursery.start_soon(generate, conn, 4)
                assert handle.statistics().tokens_generated == 5 + 3 + 4
                # Counted while a request runs, not when it ends: the rate is live.
                stream = conn.generate(SamplingParams(max_tokens=1000), prompt="hello")
                try:
                    for _ in range(3):
                        await stream.receive()
                    now = handle.statistics().tokens_generated
                    assert now is not None and now >= 12 + 3
                finally:
                    stream.close()
            handle.request_unload(force=True)
            await wait_for(lambda: handle.state is State.STOPPED, 10, "the unload")
            assert handle.statistics().tokens_generated is None  # a new worker starts from 0
