"""Who may use which route: the pure decisions of router/server/auth.py and router/server/cors.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.server import cors
from router.server.auth import INCORRECT, MISSING, Access, access_of, authorize, is_loopback, presented_key, refuse_bind
from supervisor.config import keys
from supervisor.config import ConfigError, parse
from supervisor.errors import Forbidden, Unauthorized
from supervisor.config.keys import Keyring, KeySource
from tests.harness import write_gguf, config_text
from tests.secrets import secret

API = secret("api")
SCOPED = secret("scoped")
ADMIN = secret("admin")


def _ring(api: bool = True, admin: bool = True) -> Keyring:
    sources = []
    if api:
        sources += [KeySource("server.api_keys[0]", API, None, None), KeySource("server.api_keys[1]", SCOPED, None, ("a",))]
    if admin:
        sources.append(KeySource("server.admin_keys[0]", ADMIN, None, None, admin=True))
    ring, bad = keys.keyring(sources, {"a": "a", "b": "b"})
    assert bad == []
    return ring


@pytest.mark.parametrize(
    ("path", "access"),
    [
        ("/health", Access.OPEN),
        ("/", Access.OPEN),  # the dashboard's page: static, its data comes from /admin/*
        ("//", Access.API),
        ("/index.html", Access.API),
        ("/metrics", Access.ADMIN),
        ("/admin", Access.ADMIN),
        ("/admin/models", Access.ADMIN),
        ("/admin/models/x/load", Access.ADMIN),
        ("/v1/chat/completions", Access.API),
        ("/tokenize", Access.API),
        ("/openapi.json", Access.API),
        ("/administrator", Access.API),
        ("/health/x", Access.API),
        ("/no/such/route", Access.API),
    ],
)
def test_routes_fall_in_three_kinds(path: str, access: Access) -> None:
    assert access_of(path) is access
    # `[server] public_metrics` opens /metrics alone.
    assert access_of(path, public_metrics=True) is (Access.OPEN if path == "/metrics" else access)


@pytest.mark.parametrize(
    ("authorization", "x_api_key", "key"),
    [
        (f"Bearer {API}", None, API),
        (f"bearer   {API}  ", None, API),
        (None, API, API),
        (f"Basic {API}", None, None),
        ("Bearer ", None, None),
        ("Bearer", API, API),
        (f"Bearer {API}", "other", API),
        (None, "  ", None),
        (None, None, None),
    ],
)
def test_the_key_comes_from_authorization_or_x_api_key(
    authorization: str | None, x_api_key: str | None, key: str | None
) -> None:
    assert presented_key(authorization, x_api_key) == key


def test_inference_routes_need_an_api_or_admin_key_once_api_keys_exist() -> None:
    ring = _ring()
    for loopback in (True, False):
        with pytest.raises(Unauthorized) as missing:
            authorize(ring, Access.API, None, loopback)
        assert missing.value.message == MISSING
        with pytest.raises(Unauthorized) as wrong:
            authorize(ring, Access.API, secret("wrong"), loopback)
        assert wrong.value.message == INCORRECT
    api = authorize(ring, Access.API, API, False)
    assert api is not None and api.name == "api_keys[0]"
    admin = authorize(ring, Access.API, ADMIN, False)
    assert admin is not None and admin.admin


def test_without_api_keys_inference_is_open_and_a_stray_key_is_ignored() -> None:
    ring = _ring(api=False)
    assert authorize(ring, Access.API, None, False) is None
    assert authorize(ring, Access.API, "sk-no-key-required", False) is None
    assert authorize(Keyring(), Access.API, None, False) is None


def test_admin_routes_need_an_admin_key_when_one_is_configured() -> None:
    ring = _ring()
    for loopback in (True, False):  # loopback is no excuse once admin keys exist
        with pytest.raises(Unauthorized):
            authorize(ring, Access.ADMIN, None, loopback)
        with pytest.raises(Unauthorized):
            authorize(ring, Access.ADMIN, secret("wrong"), loopback)
        with pytest.raises(Forbidden):
            authorize(ring, Access.ADMIN, API, loopback)
    admin = authorize(ring, Access.ADMIN, ADMIN, False)
    assert admin is not None and admin.admin


def test_without_any_key_admin_routes_answer_loopback_only() -> None:
    ring = Keyring()
    assert authorize(ring, Access.ADMIN, None, True) is None
    with pytest.raises(Forbidden):
        authorize(ring, Access.ADMIN, None, False)


def test_with_api_keys_but_no_admin_keys_admin_routes_answer_no_one() -> None:
    """Issue 40, finding 5: on a shared host every local user is a loopback client, so
    once API keys exist, keyless loopback access to /admin and /metrics would let any of
    them unload or reload. The 403 says what to configure."""
    ring = _ring(admin=False)
    for loopback in (True, False):
        for presented in (None, API, secret("wrong")):
            with pytest.raises(Forbidden) as refused:
                authorize(ring, Access.ADMIN, presented, loopback)
            assert "[server] admin_keys" in refused.value.message and "$CORRAL_ADMIN_KEY" in refused.value.message


def test_health_is_open_to_anyone() -> None:
    assert authorize(_ring(), Access.OPEN, None, False) is None
    assert authorize(_ring(), Access.OPEN, secret("wrong"), False) is None


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("0.0.0.0", False),
        ("fe80::1%eth0", False),
        ("localhost", False),  # a peer address is never a name
        ("", True),  # no peer address: a Unix socket, or an in-process client
        (None, True),
    ],
)
def test_loopback_peers(address: str | None, loopback: bool) -> None:
    assert is_loopback(address) is loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.5"])
def test_loopback_binds_need_no_key(host: str) -> None:
    assert refuse_bind(host, Keyring(), allow_insecure_bind=False) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.168.1.5", "example.org"])
def test_other_binds_need_an_api_key_or_the_operators_word(host: str) -> None:
    why = refuse_bind(host, Keyring(), allow_insecure_bind=False)
    assert why is not None and repr(host) in why and "api_keys" in why and "allow_insecure_bind" in why
    assert refuse_bind(host, _ring(admin=False), allow_insecure_bind=False) is None
    assert refuse_bind(host, Keyring(), allow_insecure_bind=True) is None
    # An admin key alone leaves inference open to the network.
    assert refuse_bind(host, _ring(api=False), allow_insecure_bind=False) is not None


def test_cors_allows_configured_origins_only() -> None:
    origins = ["https://app.example", "http://localhost:3000"]
    assert cors.allowed("https://app.example", origins) == "https://app.example"
    assert cors.allowed("https://evil.example", origins) is None
    assert cors.allowed("https://app.example.evil", origins) is None
    assert cors.allowed(None, origins) is None
    assert cors.allowed("https://app.example", []) is None
    # "*" echoes the page's origin, as llama-server's default (--cors-origins "*" with
    # credentials) does (server-http.cpp, set_pre_routing_handler): a browser refuses a
    # literal "*" to a page that sends credentials.
    assert cors.allowed("https://anything", ["*"]) == "https://anything"


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [  # llama.cpp's test_security.py, test_cors_origins_localhost_reflects / _rejects
        ("http://localhost", True),
        ("http://localhost:8080", True),
        ("http://127.0.0.1", True),
        ("http://127.0.0.1:3000", True),
        ("http://[::1]", True),
        ("http://[::1]:3000", True),
        ("https://localhost:8443", True),
        ("http://web.mydomain.fr", False),
        ("http://evil.com", False),
        ("http://notlocalhost", False),
        ("http://localhost.evil.com", False),
    ],
)
def test_cors_localhost_is_any_loopback_page(origin: str, allowed: bool) -> None:
    """llama-server's --cors-origins localhost: a page on this machine, any port."""
    assert (cors.allowed(origin, ["localhost"]) == origin) is allowed


def test_cors_host_patterns_take_any_scheme_and_port() -> None:
    assert cors.allowed("https://chat.example:8443", ["chat.example"]) == "https://chat.example:8443"
    assert cors.allowed("http://chat.example", ["chat.example"]) == "http://chat.example"
    assert cors.allowed("https://a.chat.example", ["chat.example"]) is None
    assert cors.allowed("https://a.b.example.com", [".example.com"]) == "https://a.b.example.com"
    assert cors.allowed("https://example.com", [".example.com"]) == "https://example.com"
    assert cors.allowed("https://badexample.com", [".example.com"]) is None


def test_a_preflight_allows_what_the_page_asked_for() -> None:
    h = cors.preflight_headers("https://app.example", "authorization, content-type, x-stainless-os")
    assert h["access-control-allow-origin"] == "https://app.example"
    assert h["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"
    assert "POST" in h["access-control-allow-methods"] and h["access-control-max-age"] == "600"
    assert "DELETE" in h["access-control-allow-methods"]  # /models/unload's peers, /v1/responses/{id}
    assert h["access-control-allow-credentials"] == "true"  # as llama-server's
    assert "access-control-allow-headers" not in cors.preflight_headers("*", None)


def _parse(tmp_path: Path, **server: object) -> None:
    write_gguf(tmp_path / "dummy.gguf")
    parse(config_text({"a": {}}, server), tmp_path)


def test_tls_needs_both_files(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").touch()
    with pytest.raises(ConfigError) as exc:
        _parse(tmp_path, tls_cert="cert.pem")
    assert exc.value.problems == ["server.tls_cert: tls_cert and tls_key go together: set both, or neither"]
    with pytest.raises(ConfigError) as exc:
        _parse(tmp_path, tls_cert="cert.pem", tls_key="key.pem")
    assert exc.value.problems == [f"server.tls_key: no such file: {tmp_path / 'key.pem'}"]


@pytest.mark.parametrize("origin", ["https://app.example/", "app.example:80", "https://a.example/path", "", "* ", "a b"])
def test_cors_origins_must_be_origins(tmp_path: Path, origin: str) -> None:
    with pytest.raises(ConfigError) as exc:
        _parse(tmp_path, cors_origins=["https://ok.example", origin])
    assert len(exc.value.problems) == 1 and exc.value.problems[0].startswith("server.cors_origins[1]: ")


def test_good_cors_origins_pass(tmp_path: Path) -> None:
    _parse(tmp_path, cors_origins=["https://app.example", "http://localhost:3000", "*"])


def test_an_open_route_knows_a_configured_key_sent_to_it_and_ignores_a_wrong_one() -> None:
    from router.server.auth import Access, authorize
    from supervisor.config import keys as keys_mod

    ring, _ = keys_mod.keyring(
        [KeySource("server.admin_keys[0]", "admin-key-123456", None, None, admin=True)], {}
    )
    key = authorize(ring, Access.OPEN, "admin-key-123456", loopback=False)
    assert key is not None and key.admin
    assert authorize(ring, Access.OPEN, "wrong-key-1234567", loopback=False) is None
    assert authorize(ring, Access.OPEN, None, loopback=False) is None
