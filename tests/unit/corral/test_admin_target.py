"""corral/admin_target.py: where `corral status` and friends find the server, the key's
checks, and what each answer means as an exit code."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from corral import admin_target as at
from corral.admin_commands import Exit, find_url


@pytest.mark.parametrize(
    ("server", "url"),
    [
        (None, "http://127.0.0.1:8080"),
        ({}, "http://127.0.0.1:8080"),
        ({"host": "0.0.0.0", "port": 9000}, "http://127.0.0.1:9000"),
        ({"host": "::", "port": 9000}, "http://[::1]:9000"),
        ({"host": "::1"}, "http://[::1]:8080"),
        ({"host": "10.1.2.3", "tls_cert": "cert.pem"}, "https://10.1.2.3:8080"),
        ({"host": "box.example", "port": 443, "api_keys": ["ignored"]}, "http://box.example:443"),
    ],
)
def test_url_from_the_server_table(server: object, url: str) -> None:
    assert at.url_from_server(server) == url


@pytest.mark.parametrize(
    ("server", "needle"),
    [({"port": "80"}, "port an integer"), ({"port": 0}, "cannot be connected to"), ({"host": 1}, "host must be")],
)
def test_a_server_table_that_names_no_address(server: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        at.url_from_server(server)


def test_urls() -> None:
    assert at.check_url("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"
    assert at.check_url(" https://box/corral/ ") == "https://box/corral"  # behind a proxy's prefix
    for bad, needle in [("localhost:8080", "not an http"), ("ftp://x", "not an http"), ("http://", "not an http"),
                        ("http://x:99999", "out of range"), ("http://x/?a=1", r"without \?query")]:
        with pytest.raises(ValueError, match=needle):
            at.check_url(bad)


def test_keys_are_checked_without_being_shown() -> None:
    assert at.check_key("  k-123\n", "the file") == "k-123"
    for bad in ("", " \n", "two words", "a\nb", "kéy"):
        with pytest.raises(ValueError) as caught:
            at.check_key(bad, "the file")
        assert str(caught.value).startswith("the file") and (not bad.strip() or bad.strip() not in str(caught.value))


def test_exit_codes() -> None:
    assert [at.exit_code(s, None) for s in (200, 202, 400, 401, 403, 500, 503)] == [0, 0, 1, 4, 4, 1, 1]
    assert at.exit_code(404, "model_not_found") == 5
    assert at.exit_code(404, None) == 1  # a route that is not there: not a Corral server of this version
    assert "3  cannot reach the server" in at.EXIT_CODES_HELP


def test_a_refusal_without_a_key_says_where_the_key_goes() -> None:
    """Issue 40, finding 5: a server with API keys answers /admin only to an admin key,
    loopback included; the command says where it reads one from (and, for a reload, that
    SIGHUP needs none)."""
    for status in (401, 403):
        hint = at.refused_hint(status, key_sent=False)
        assert "$CORRAL_ADMIN_KEY" in hint and "--admin-key-file" in hint and "admin_keys" in hint
        assert "--signal" not in hint and "--signal" in at.refused_hint(status, key_sent=False, signal=True)
        assert at.refused_hint(status, key_sent=True) == ""  # the server's words say what is wrong with it
    assert at.refused_hint(404, key_sent=False) == at.refused_hint(500, key_sent=False) == ""


def test_reload_lines() -> None:
    diff = {"added": ["d"], "removed": [], "changed": ["a", "b"], "unchanged": ["c"], "needs_restart": []}
    assert at.reload_lines(diff) == ["added: d", "changed: a, b", "unchanged: c"]
    assert at.reload_lines({"added": [], "unchanged": ["a"]}) == ["no changes", "unchanged: a"]
    assert at.reload_lines({"upstreams_changed": ["far"], "unchanged": ["a"]}) == ["changed upstream: far", "unchanged: a"]


def _args(url: str | None = None, config: str | None = None) -> argparse.Namespace:
    # --url may be given several times (`corral status`'s fleet view): argparse makes a list.
    return argparse.Namespace(url=None if url is None else [url], config=config, admin_key_file=None)


def test_where_the_server_is_in_order_of_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert find_url(_args(), env) == at.DEFAULT_URL  # nothing anywhere

    (tmp_path / "corral.toml").write_text("[server]\nport = 7001\n")
    assert find_url(_args(), env) == "http://127.0.0.1:7001"  # the search path's file
    env[at.URL_ENV] = "http://env:7002/"
    assert find_url(_args(), env) == "http://env:7002"  # $CORRAL_URL beats a searched file
    named = tmp_path / "named.toml"
    # A config the server would refuse (an unknown key, no models) still names its address.
    named.write_text('[server]\nhost = "0.0.0.0"\nport = 7003\nbogus = 1\n')
    assert find_url(_args(config=str(named)), env) == "http://127.0.0.1:7003"  # --config beats $CORRAL_URL
    assert find_url(_args(url="http://cli:7004", config=str(named)), env) == "http://cli:7004"  # --url beats all
    # Two --urls are for `corral status` alone (corral/admin_commands.py, status).
    with pytest.raises(ValueError, match="only `corral status` takes several"):
        find_url(argparse.Namespace(url=["http://a:1", "http://b:2"], config=None, admin_key_file=None), env)

    (tmp_path / "corral.toml").write_text("[server\n")
    del env[at.URL_ENV]
    with pytest.raises(Exit) as caught:
        find_url(_args(), env)
    assert caught.value.code == at.USAGE and "corral.toml" in caught.value.message and "give --url" in caught.value.message
    with pytest.raises(Exit) as caught:
        find_url(_args(config=str(tmp_path / "missing.toml")), env)
    assert caught.value.code == at.USAGE and "missing.toml" in caught.value.message
