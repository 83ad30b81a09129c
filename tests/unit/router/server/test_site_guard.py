"""router/server/site_guard.py's decisions (issue 20, item 5), and the config check of
[server] allowed_hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.server.site_guard import host_allowed, origin_allowed, own_origin, parse_origin, split_host
from supervisor.config import ConfigError, parse
from tests.harness import config_text, write_gguf


@pytest.mark.parametrize(
    ("header", "parsed"),
    [
        ("localhost:8080", ("localhost", 8080)),
        ("LocalHost.", ("localhost", None)),
        ("127.0.0.1", ("127.0.0.1", None)),
        ("[::1]:8080", ("::1", 8080)),
        ("[::1]", ("::1", None)),
        ("::1", ("::1", None)),
        ("llm.example.com:443", ("llm.example.com", 443)),
        ("host:0", None),
        ("host:99999", None),
        ("host:http", None),
        ("[::1", None),
        ("[::1]x", None),
        ("", None),
        ("a b", None),
        ("user@host", None),
        ("host/path", None),
    ],
)
def test_a_host_header_is_read_as_browsers_and_servers_write_it(header: str, parsed: tuple[str, int | None] | None) -> None:
    assert split_host(header) == parsed


def test_loopback_names_and_addresses_are_local_and_nothing_that_merely_contains_them() -> None:
    for host in ("localhost", "localhost:8080", "app.localhost", "127.0.0.1:1", "127.9.9.9", "[::1]:8080",
                 "[::ffff:127.0.0.1]", "LOCALHOST."):
        assert host_allowed(host, [], "127.0.0.1"), host
    for host in ("evil.example", "127.0.0.1.nip.io", "localhost.evil.example", "localhostx", "10.0.0.1",
                 "0.0.0.0", "[::]", "", " ", "evil.example:8080"):
        assert not host_allowed(host, [], "127.0.0.1"), host
    assert host_allowed(None, [], "127.0.0.1")  # HTTP/1.0 without Host: no browser


def test_the_bound_address_and_allowed_hosts_are_admitted_but_every_interface_is_no_name() -> None:
    assert host_allowed("192.168.1.5:8080", [], "192.168.1.5")
    assert not host_allowed("192.168.1.5:8080", [], "0.0.0.0")
    assert not host_allowed("0.0.0.0:8080", [], "0.0.0.0")
    allowed = ["LLM.example.com", ".corp.example", "[fe80::1]"]
    for host in ("llm.example.com", "llm.example.com.:443", "corp.example", "a.b.corp.example", "[fe80::1]:80"):
        assert host_allowed(host, allowed, "127.0.0.1"), host
    for host in ("example.com", "xllm.example.com", "corp.example.evil", "xcorp.example"):
        assert not host_allowed(host, allowed, "127.0.0.1"), host
    assert host_allowed("anything.example", ["*"], "127.0.0.1")


def test_origins_compare_by_scheme_host_and_port_with_default_ports() -> None:
    assert parse_origin("https://app.example") == ("https", "app.example", 443)
    assert parse_origin("HTTP://App.Example:80") == ("http", "app.example", 80)
    for bad in ("null", "file://", "app.example", "https://app.example/", "ftp://x", "https://a b", ""):
        assert parse_origin(bad) is None, bad
    own = own_origin("http", "127.0.0.1:8080")
    assert origin_allowed("http://127.0.0.1:8080", [], own)
    assert not origin_allowed("http://127.0.0.1:8081", [], own)  # another local server's page
    assert not origin_allowed("https://127.0.0.1:8080", [], own)
    assert not origin_allowed("http://localhost:8080", [], own)  # reached by another name
    assert not origin_allowed("null", [], own)
    assert origin_allowed("https://app.example:443", ["https://app.example"], own)
    assert not origin_allowed("https://app.example.evil", ["https://app.example"], own)
    assert origin_allowed("null", ["*"], own)


def test_behind_a_tls_proxy_the_own_origin_is_the_one_the_proxy_names() -> None:
    own = own_origin("http", "llm.example.com", forwarded_proto="https")
    assert origin_allowed("https://llm.example.com", [], own)
    own = own_origin("http", "127.0.0.1:8080", forwarded_proto="https, http", forwarded_host="llm.example.com")
    assert own == ("https", "llm.example.com", 443)
    assert own_origin("http", "127.0.0.1", forwarded_proto="gopher") == ("http", "127.0.0.1", 80)


def test_allowed_hosts_must_be_names_or_addresses(tmp_path: Path) -> None:
    write_gguf(tmp_path / "dummy.gguf")
    good = ["llm.example.com", ".corp.example", "192.168.1.5", "[::1]", "fe80::1", "localhost.", "*"]
    parse(config_text({"m": {}}, {"allowed_hosts": good}), tmp_path)
    bad = ["http://llm.example.com", "llm.example.com:8080", "a b", "", "cafe:8080", "[::1]:80", "*.example.com"]
    with pytest.raises(ConfigError) as exc:
        parse(config_text({"m": {}}, {"allowed_hosts": bad}), tmp_path)
    assert [p.split(":")[0] for p in exc.value.problems] == [f"server.allowed_hosts[{i}]" for i in range(len(bad))]
