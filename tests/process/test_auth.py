"""Keys, scopes, loopback-only admin, CORS and TLS, through the real app and supervisor
(fake workers)."""

from __future__ import annotations

import logging
from functools import partial
import re
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import trio
import trustme

from router.app import create_app
from corral.serve import serve
from supervisor.config import Config, parse
from supervisor.supervisor import Supervisor
from tests.harness import write_gguf, config_text, running
from tests.process.support import WORKER_COMMAND, serving_http
from tests.secrets import secret

API = secret("api")
SCOPED = secret("scoped")
ADMIN = secret("admin")
LATE = secret("late")
WRONG = secret("wrong")
SECRETS = (API, SCOPED, ADMIN, LATE)

REMOTE = {"client": ("10.1.2.3", 40000)}
# Routes that need no key: health checks, and the dashboard's static page (router/server/dashboard.py).
OPEN_PATHS = ("/health", "/v1/health", "/")  # /v1/health: llama-server's second name for it
LOOPBACK_2 = {"client": ("127.0.0.2", 40000)}


def _config(tmp_path: Path, **server: object) -> Config:
    write_gguf(tmp_path / "dummy.gguf")
    text = config_text({"a": {"aliases": ["alias-a"]}, "b": {}}, server)
    path = tmp_path / "config.toml"
    path.write_text(text)
    cfg = parse(text, tmp_path)
    return Config(cfg.server, cfg.supervisor, cfg.models, path, cfg.keys)


def _keyed(tmp_path: Path, **server: object) -> Supervisor:
    (tmp_path / "keys.txt").write_text(f"{SCOPED} name=scoped models=alias-a\n")
    cfg = _config(tmp_path, api_keys=[API], api_keys_file="keys.txt", admin_keys=[ADMIN], **server)
    return Supervisor(cfg, worker_command=WORKER_COMMAND)


def _routes(sup: Supervisor) -> list[tuple[str, str]]:
    """(method, path) for every route the app registers, with `x` for each variable."""
    app = create_app(sup, sup.config)
    return [
        (method, re.sub(r"<[^>]+>", "x", rule.rule))
        for rule in app.url_map.iter_rules()
        for method in sorted(rule.methods or ())
    ]


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# llama-server's /tools and /cors-proxy answer 403 feature_disabled without --tools and
# --webui-mcp-proxy (router/api/llama/features_off.py): past the key check, that is their answer.
FEATURE_OFF = ("/tools", "/cors-proxy")


async def test_every_route_but_health_and_the_dashboard_page_refuses_a_missing_or_wrong_key(
    tmp_path: Path,
) -> None:
    sup = _keyed(tmp_path)
    client = create_app(sup, sup.config).test_client()
    routes = _routes(sup)
    assert len(routes) > 40 and ("POST", "/v1/chat/completions") in routes  # the walk sees them all
    checked = 0
    with trio.fail_after(30):
        async with running(sup):
            for method, path in routes:
                for headers in ({}, _bearer(WRONG), {"x-api-key": WRONG}):
                    r = await client.open(path, method=method, headers=headers, scope_base=REMOTE)
                    if path in OPEN_PATHS:
                        assert r.status_code == 200, (method, path)
                        continue
                    assert r.status_code == 401, (method, path, headers, r.status_code)
                    assert r.headers["www-authenticate"].startswith("Bearer")
                    if method != "HEAD":
                        body = await r.get_json()
                        error = body["error"]
                        if path.startswith("/api/"):  # Ollama's shape: the message alone
                            assert isinstance(error, str) and "key" in error.lower(), (path, error)
                        elif path.startswith("/v1/messages"):  # Anthropic's shape
                            assert body["type"] == "error" and error["type"] == "authentication_error", (path, body)
                        else:  # OpenAI's shape on /v1 routes, llama-server's on its own
                            assert error.get("code") in ("invalid_api_key", 401), (path, error)
                    checked += 1
                # The right key gets past the check (whatever the route then answers). The
                # event stream never ends: its own test reads it (test_admin_events.py).
                if path == "/admin/events":
                    continue
                # llama-server's POST /models/unload is an admin key's too (issue 40, finding 5),
                # and so is POST /lora-adapters, which sets every key's scales (issue 45).
                admin_only = path in ("/metrics", "/models/unload") or (method, path) == ("POST", "/lora-adapters")
                key = ADMIN if path.startswith("/admin") or admin_only else API
                r = await client.open(path, method=method, headers=_bearer(key), scope_base=REMOTE)
                if path in FEATURE_OFF and method in ("GET", "HEAD", "POST"):  # llama-server's 403 for a feature it was not started with
                    assert r.status_code == 403, (method, path, r.status_code)
                    if method != "HEAD":
                        assert (await r.get_json())["error"]["type"] == "feature_disabled"
                    continue
                assert r.status_code not in (401, 403), (method, path, r.status_code)
    # /health's and /'s GET, HEAD and OPTIONS aside
    assert checked == 3 * (len(routes) - 3 * len(OPEN_PATHS))


async def test_an_unknown_route_needs_a_key_too(tmp_path: Path) -> None:
    client = create_app(sup := _keyed(tmp_path), sup.config).test_client()
    r = await client.get("/v2/secret-route", scope_base=REMOTE)
    assert r.status_code == 401
    r = await client.get("/v2/secret-route", headers=_bearer(API), scope_base=REMOTE)
    assert r.status_code == 404


async def test_an_api_key_is_not_an_admin_key(tmp_path: Path) -> None:
    client = create_app(sup := _keyed(tmp_path), sup.config).test_client()
    for path in ("/admin/models", "/metrics"):
        r = await client.get(path, headers=_bearer(API), scope_base=LOOPBACK_2)
        assert r.status_code == 403
        error = (await r.get_json())["error"]
        assert error["code"] == "insufficient_permissions" and "admin key" in error["message"]
        r = await client.get(path, headers={"x-api-key": ADMIN}, scope_base=REMOTE)
        assert r.status_code == 200
    # An admin key is good for inference too.
    r = await client.get("/v1/models", headers=_bearer(ADMIN), scope_base=REMOTE)
    assert r.status_code == 200 and len((await r.get_json())["data"]) == 2


async def test_public_metrics_answers_any_client_without_a_key_and_nothing_else_opens(tmp_path: Path) -> None:
    """`[server] public_metrics`: for scrapers that send no key, such as the Gateway API
    Inference Extension's endpoint picker (issue 25). /metrics answers a remote client with
    no key, or with a wrong one; /admin and the API still need theirs."""
    for admin_keys in ([ADMIN], []):
        sup = Supervisor(_config(tmp_path, api_keys=[API], admin_keys=admin_keys, public_metrics=True),
                         worker_command=WORKER_COMMAND)
        client = create_app(sup, sup.config).test_client()
        for headers in ({}, _bearer(secret("not-a-key"))):
            r = await client.get("/metrics", headers=headers, scope_base=REMOTE)
            assert r.status_code == 200, (admin_keys, headers)
            assert "corral_model_requests_waiting" in (await r.get_data()).decode()
        r = await client.get("/admin/models", scope_base=REMOTE)
        assert r.status_code == (401 if admin_keys else 403)
        r = await client.get("/v1/models", scope_base=REMOTE)
        assert r.status_code == 401


async def test_without_any_key_admin_answers_loopback_clients_only(tmp_path: Path) -> None:
    # With API keys but no admin key, no one (test_steering.py, issue 40, finding 5).
    sup = Supervisor(_config(tmp_path), worker_command=WORKER_COMMAND)
    client = create_app(sup, sup.config).test_client()
    for path in ("/admin/models", "/metrics"):
        r = await client.get(path, scope_base=REMOTE)
        assert r.status_code == 403 and "loopback" in (await r.get_json())["error"]["message"]
        for peer in (LOOPBACK_2, {"client": ("::1", 1)}):
            r = await client.get(path, scope_base=peer)
            assert r.status_code == 200, (path, peer)
        # The peer is the connection's, whatever a header claims.
        for spoof in ("remote-addr", "x-forwarded-for", "x-real-ip"):
            r = await client.get(path, headers={spoof: "127.0.0.1"}, scope_base=REMOTE)
            assert r.status_code == 403, spoof


async def test_a_scoped_key_sees_only_its_models(tmp_path: Path) -> None:
    sup = _keyed(tmp_path)
    client = create_app(sup, sup.config).test_client()
    scoped = _bearer(SCOPED)

    async def get(path: str, key: dict[str, str]) -> tuple[int, Any]:
        r = await client.get(path, headers=key, scope_base=REMOTE)
        return r.status_code, await r.get_json()

    with trio.fail_after(30):
        async with running(sup):
            _, listed = await get("/v1/models", scoped)
            assert [m["id"] for m in listed["data"]] == ["a"]
            assert (await get("/v1/models/alias-a", scoped))[0] == 200
            # A model outside the scope answers exactly as one that does not exist.
            outside = await get("/v1/models/b", scoped)
            missing = await get("/v1/models/nope", scoped)
            assert outside[0] == missing[0] == 404
            assert outside[1] == {"error": {**missing[1]["error"], "message": "The model `b` does not exist."}}
            r = await client.post(
                "/v1/chat/completions", headers=scoped, scope_base=REMOTE,
                json={"model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            )
            assert r.status_code == 404 and (await r.get_json())["error"]["code"] == "model_not_found"
            status, body = await get("/props?model=b", scoped)  # llama-server's routes too
            assert status == 404 and body["error"]["type"] == "not_found_error"
            r = await client.post(
                "/v1/chat/completions", headers=scoped, scope_base=REMOTE,
                json={"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            )
            assert r.status_code == 200
            _, everything = await get("/v1/models", _bearer(API))
            assert sorted(m["id"] for m in everything["data"]) == ["a", "b"]


async def test_a_scoped_key_does_not_reach_a_default_model_outside_its_scope(tmp_path: Path) -> None:
    (tmp_path / "keys.txt").write_text(f"{SCOPED} models=a\n")
    cfg = _config(tmp_path, api_keys=[API], api_keys_file="keys.txt", default_model="b")
    sup = Supervisor(cfg, worker_command=WORKER_COMMAND)
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(30):
        async with running(sup):
            r = await client.get("/props", headers=_bearer(SCOPED), scope_base=REMOTE)
            assert r.status_code == 400 and "model" in (await r.get_json())["error"]["message"]
            r = await client.get("/props", headers=_bearer(API), scope_base=REMOTE)
            assert r.status_code == 200


async def test_a_reload_rereads_the_keys_file_and_never_shows_a_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sup = _keyed(tmp_path)
    client = create_app(sup, sup.config).test_client()
    admin = _bearer(ADMIN)
    with trio.fail_after(30):
        async with running(sup):
            assert (await client.get("/v1/models", headers=_bearer(LATE), scope_base=REMOTE)).status_code == 401
            (tmp_path / "keys.txt").write_text(f"{LATE} name=late\n")
            r = await client.post("/admin/reload", headers=admin, scope_base=REMOTE)
            assert r.status_code == 200
            reloaded = await r.get_json()
            assert reloaded["changed"] == [] and reloaded["needs_restart"] == []  # keys apply live
            assert (await client.get("/v1/models", headers=_bearer(LATE), scope_base=REMOTE)).status_code == 200
            assert (await client.get("/v1/models", headers=_bearer(SCOPED), scope_base=REMOTE)).status_code == 401
            # A keys file that breaks the config is refused without quoting it.
            (tmp_path / "keys.txt").write_text(f"{LATE} name=late\n{API} secret\n")
            r = await client.post("/admin/reload", headers=admin, scope_base=REMOTE)
            assert r.status_code == 400
            refused = await r.get_data()
            assert b"keys.txt:2" in refused
            assert (await client.get("/v1/models", headers=_bearer(LATE), scope_base=REMOTE)).status_code == 200
            shown = [await (await client.get(p, headers=admin, scope_base=REMOTE)).get_data() for p in ("/admin/models", "/metrics")]
    for text in [caplog.text.encode(), refused, *shown]:
        for secret in SECRETS:
            assert secret.encode() not in text


async def test_cors_preflight_needs_no_key_and_errors_carry_the_origin(tmp_path: Path) -> None:
    sup = _keyed(tmp_path, cors_origins=["https://app.example"])
    client = create_app(sup, sup.config).test_client()
    ask = {
        "origin": "https://app.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-lang",
    }
    # 200, as llama-server answers a preflight (llama.cpp's test_security.py, test_cors_options).
    r = await client.options("/v1/chat/completions", headers=ask, scope_base=REMOTE)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert r.headers["access-control-allow-headers"] == ask["access-control-request-headers"]
    # A page the config does not name gets a preflight answer that allows nothing (as
    # llama-server's test_cors_origins_localhost_rejects expects), and its requests are
    # refused before the key check (issue 20, item 5: router/server/site_guard.py).
    r = await client.options("/v1/chat/completions", headers={**ask, "origin": "https://evil.example"}, scope_base=REMOTE)
    assert r.status_code == 200 and not any(h.lower().startswith("access-control-") for h in r.headers.keys())
    r = await client.post("/v1/chat/completions", headers={"origin": "https://evil.example", **_bearer(API)}, scope_base=REMOTE)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    # The page can read an error's body and its headers.
    r = await client.get("/v1/models", headers={"origin": "https://app.example"}, scope_base=REMOTE)
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "https://app.example"
    assert "retry-after" in r.headers["access-control-expose-headers"]
    r = await client.get("/v1/models", headers={"origin": "https://app.example", **_bearer(API)}, scope_base=REMOTE)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"


async def test_without_cors_origins_no_response_carries_cors_headers(tmp_path: Path) -> None:
    client = create_app(sup := _keyed(tmp_path), sup.config).test_client()
    r = await client.get("/v1/models", headers=_bearer(API), scope_base=REMOTE)
    assert r.status_code == 200 and not any(h.lower().startswith("access-control-") for h in r.headers.keys())
    # A foreign page's request, even with a key, is refused (issue 20, item 5).
    r = await client.get("/v1/models", headers={"origin": "https://app.example", **_bearer(API)}, scope_base=REMOTE)
    assert r.status_code == 403 and not any(h.lower().startswith("access-control-") for h in r.headers.keys())


def _non_loopback_address() -> str | None:
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family.name == "AF_INET" and not a.address.startswith("127."):
                return str(a.address)
    return None


async def test_bound_to_every_interface_a_key_serves_a_client_from_another_address(tmp_path: Path) -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    sup = _keyed(tmp_path)
    with trio.fail_after(30):
        async with serving_http(sup, bind=["0.0.0.0:0"]) as base:
            port = base.rsplit(":", 1)[1]
            async with httpx.AsyncClient(base_url=f"http://{address}:{port}", timeout=10) as c:
                assert (await c.get("/v1/models")).status_code == 401
                r = await c.get("/v1/models", headers=_bearer(API))
                assert r.status_code == 200 and len(r.json()["data"]) == 2
                assert (await c.get("/admin/models", headers=_bearer(API))).status_code == 403
                assert (await c.get("/admin/models", headers=_bearer(ADMIN))).status_code == 200


async def test_loopback_admin_over_a_real_socket_from_a_second_loopback_address(tmp_path: Path) -> None:
    # No key configured: the one user's loopback rule (with API keys, test_steering.py).
    sup = Supervisor(_config(tmp_path, allow_insecure_bind=True), worker_command=WORKER_COMMAND)
    address = _non_loopback_address()
    with trio.fail_after(30):
        async with serving_http(sup, bind=["0.0.0.0:0"]) as base:
            port = base.rsplit(":", 1)[1]
            async with httpx.AsyncClient(base_url=f"http://127.0.0.2:{port}", timeout=10) as c:
                assert (await c.get("/admin/models")).status_code == 200
            if address is not None:
                async with httpx.AsyncClient(base_url=f"http://{address}:{port}", timeout=10) as c:
                    r = await c.get("/admin/models", headers={"host": "localhost"})
                    assert r.status_code == 403 and "loopback" in r.json()["error"]["message"]


def _serve(config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", "serve", "--config", str(config)],
        capture_output=True, text=True, timeout=60, env=env,
    )


def test_serve_refuses_every_interface_without_a_key(tmp_path: Path) -> None:
    write_gguf(tmp_path / "dummy.gguf")
    path = tmp_path / "config.toml"
    path.write_text(config_text({"a": {}}, {"host": "0.0.0.0", "port": 1}))
    done = _serve(path)
    assert done.returncode == 1
    assert "refusing to serve on '0.0.0.0' with no API key" in done.stderr
    assert "api_keys" in done.stderr and "allow_insecure_bind = true" in done.stderr


async def test_serve_with_tls(tmp_path: Path) -> None:
    """`corral serve` over HTTPS, with a throwaway CA."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cfg = _config(tmp_path, api_keys=[API], tls_cert="server.pem", tls_key="key.pem", port=0)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, cfg, worker_command=WORKER_COMMAND))
            url = binds[0]
            assert url.startswith("https://127.0.0.1:"), url
            async with httpx.AsyncClient(base_url=url, verify=context, timeout=10) as c:
                r = await c.get("/v1/models", headers=_bearer(API))
                assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["a", "b"]
            async with httpx.AsyncClient(base_url=url, timeout=10) as c:
                with pytest.raises(httpx.ConnectError):  # a certificate no CA vouches for
                    await c.get("/health")
            nursery.cancel_scope.cancel()
