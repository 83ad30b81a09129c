"""No web page can use or steer a local Corral (issue 20, item 5): requests as a browser
sends them, to the real app served by hypercorn (fake workers). On 8ad3c96 a foreign page's
simple POST to /admin/models/m/load, /unload, /reset, /admin/reload or
/v1/chat/completions was carried out (200), and a request naming the server
`Host: evil.example` (DNS rebinding) was served."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import trio

from router.app import create_app
from supervisor.config import Config, parse
from supervisor.lifecycle import State
from supervisor.supervisor import Supervisor
from tests.harness import config_text, write_gguf
from tests.process.support import WORKER_COMMAND, serving_http
from tests.secrets import secret

EVIL = "https://evil.example"
API = secret("guard-api")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _sup(tmp_path: Path, **server: object) -> Supervisor:
    write_gguf(tmp_path / "dummy.gguf")
    text = config_text({"m": {}}, server)
    path = tmp_path / "config.toml"
    path.write_text(text)
    cfg = parse(text, tmp_path)
    return Supervisor(Config(cfg.server, cfg.supervisor, cfg.models, path, cfg.keys), worker_command=WORKER_COMMAND)


def _routes(sup: Supervisor) -> list[tuple[str, str]]:
    app = create_app(sup, sup.config)
    return [
        (method, re.sub(r"<[^>]+>", "m", rule.rule))
        for rule in app.url_map.iter_rules()
        for method in sorted(rule.methods or ())
    ]


def _refused(r: httpx.Response, param: str) -> None:
    assert r.status_code == 403, (r.request.method, r.request.url, r.status_code, r.text[:200])
    if r.request.method == "HEAD":
        return
    error = r.json()["error"]
    if isinstance(error, str):  # Ollama's shape, on its /api/ routes: the message alone
        assert param in error, error
        return
    # OpenAI's envelope on its routes, llama-server's on its own: both name the header.
    assert param in error["message"] or error.get("param") == param, error
    assert "access-control-allow-origin" not in r.headers


async def test_a_foreign_pages_simple_requests_are_refused_on_every_route_before_any_work(tmp_path: Path) -> None:
    sup = _sup(tmp_path)
    routes = _routes(sup)
    assert ("POST", "/admin/models/m/load") in routes and ("POST", "/v1/chat/completions") in routes
    with trio.fail_after(60):
        async with serving_http(sup) as base, httpx.AsyncClient(base_url=base, timeout=10) as c:
            for origin in (EVIL, "null", "http://127.0.0.1:1", "http://localhost"):
                for method, path in routes:
                    # A form or fetch(..., {mode: "no-cors"}): text/plain needs no preflight.
                    r = await c.request(
                        method, path, content=b'{"model": "m"}',
                        headers={"origin": origin, "content-type": "text/plain"},
                    )
                    _refused(r, "Origin")
            # The steering requests of the report, with a JSON body too: none ran.
            for path in ("/admin/models/m/load", "/admin/reload", "/v1/chat/completions"):
                r = await c.post(path, json=CHAT, headers={"origin": EVIL})
                _refused(r, "Origin")
            assert sup.handles["m"].state is State.STOPPED
            assert sup.handles["m"].statistics().requests_per_minute == 0
            # A foreign page's preflight allows nothing, so its browser never sends the
            # non-simple request. It is answered 200 with no CORS header, as llama-server
            # answers it (llama.cpp's test_security.py, test_cors_origins_localhost_rejects).
            r = await c.options(
                "/v1/chat/completions",
                headers={"origin": EVIL, "access-control-request-method": "POST",
                         "access-control-request-headers": "content-type"},
            )
            assert r.status_code == 200 and not any(h.lower().startswith("access-control-") for h in r.headers)


async def test_the_servers_own_pages_and_configured_origins_may_call_it(tmp_path: Path) -> None:
    sup = _sup(tmp_path, cors_origins=["https://app.example"])
    with trio.fail_after(60):
        async with serving_http(sup) as base, httpx.AsyncClient(base_url=base, timeout=30) as c:
            port = base.rsplit(":", 1)[1]
            # The dashboard at /, reached by any loopback name, calls its own origin.
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST.:{port}"):
                own = "http://" + host.lower().replace(".:", ":")
                r = await c.post("/v1/chat/completions", json=CHAT, headers={"host": host, "origin": own})
                assert r.status_code == 200, (host, r.text)
                r = await c.post("/admin/models/m/unload", headers={"host": host, "origin": own})
                assert r.status_code in (200, 202), (host, r.text)
            r = await c.post("/v1/chat/completions", json=CHAT, headers={"origin": "https://app.example"})
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
            # Behind nginx's TLS the dashboard is an https page of the proxy's name.
            r = await c.get(
                "/admin/models",
                headers={"host": "localhost", "x-forwarded-proto": "https", "origin": "https://localhost"},
            )
            assert r.status_code == 200
            # Clients that are not browsers send no Origin: curl -d sends a form content type.
            r = await c.post(
                "/v1/chat/completions", content=httpx.Request("POST", "/", json=CHAT).content,
                headers={"content-type": "application/x-www-form-urlencoded"},
            )
            assert r.status_code == 200, r.text


async def test_a_rebound_host_name_is_refused_while_no_key_is_configured(tmp_path: Path) -> None:
    sup = _sup(tmp_path, allowed_hosts=["llm.example.com", ".corp.example"])
    with trio.fail_after(60):
        async with serving_http(sup) as base, httpx.AsyncClient(base_url=base, timeout=30) as c:
            port = base.rsplit(":", 1)[1]
            for host in (f"evil.example:{port}", "evil.example", "127.0.0.1.evil.example", "localhost.evil.example",
                         "example.com", "corp.example.evil", f"{port}", "", "a b"):
                for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                                     ("POST", "/admin/models/m/load"), ("GET", "/health")):
                    r = await c.request(method, path, json=CHAT, headers={"host": host})
                    if host == "":
                        assert r.status_code in (400, 403), (host, r.status_code)
                        continue
                    _refused(r, "Host")
                # Even from the page's own origin: that is what rebinding looks like.
                r = await c.post("/v1/chat/completions", json=CHAT, headers={"host": host, "origin": f"http://{host}"})
                assert r.status_code in (400, 403)
            assert sup.handles["m"].state is State.STOPPED
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "127.0.0.2", "app.localhost",
                         "LLM.example.com", "llm.example.com.", "corp.example", "a.b.corp.example"):
                r = await c.get("/v1/models", headers={"host": host})
                assert r.status_code == 200, (host, r.text)


async def test_with_an_api_key_the_host_is_not_checked_but_the_origin_still_is(tmp_path: Path) -> None:
    sup = _sup(tmp_path, api_keys=[API])
    with trio.fail_after(60):
        async with serving_http(sup) as base, httpx.AsyncClient(base_url=base, timeout=30) as c:
            key = {"authorization": f"Bearer {API}"}
            r = await c.get("/v1/models", headers={"host": "llm.example.com", **key})
            assert r.status_code == 200
            r = await c.get("/v1/models", headers={"host": "llm.example.com"})
            assert r.status_code == 401
            r = await c.post("/v1/chat/completions", json=CHAT, headers={"origin": EVIL, **key})
            _refused(r, "Origin")


async def test_allowed_hosts_and_cors_origins_apply_on_reload(tmp_path: Path) -> None:
    sup = _sup(tmp_path)
    with trio.fail_after(60):
        async with serving_http(sup) as base, httpx.AsyncClient(base_url=base, timeout=30) as c:
            headers = {"host": "llm.example.com", "origin": "https://app.example"}
            assert (await c.get("/v1/models", headers=headers)).status_code == 403
            text = config_text({"m": {}}, {"allowed_hosts": ["llm.example.com"], "cors_origins": ["https://app.example"]})
            (tmp_path / "config.toml").write_text(text)
            r = await c.post("/admin/reload")
            assert r.status_code == 200, r.text
            assert r.json().get("needs_restart", []) == []
            r = await c.get("/v1/models", headers=headers)
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
