"""The dashboard's page as shipped: small, self-contained, and allowed to run its own
script only (router/server/dashboard.py)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from router.server import dashboard

PAGE = dashboard.page()
TEXT = PAGE.decode("utf-8")


def test_the_page_is_under_50_kb() -> None:
    assert 10_000 < len(PAGE) < 50_000, len(PAGE)


def test_the_page_loads_nothing_from_elsewhere() -> None:
    # No URL with a scheme or a protocol-relative one in any src, href or url(), and no
    # @import: the page must work on a host with no internet.
    refs = re.findall(r"""(?:src|href|action)\s*=\s*["']?([^"'\s>]+)""", TEXT, re.I)
    refs += re.findall(r"""url\(\s*["']?([^"')]+)""", TEXT, re.I)
    assert [r for r in refs if re.match(r"(?:[a-z][a-z0-9+.-]*:)?//", r, re.I)] == []
    assert "@import" not in TEXT
    # (SVG's namespace is a name, not an address: createElementNS needs it, nothing loads it)
    assert re.search(r"https?://", TEXT.replace('"http://www.w3.org/2000/svg"', "")) is None
    assert re.search(r"<(?:iframe|object|embed|img)\b", TEXT, re.I) is None
    # The one link: an empty icon inline, so that the browser asks for no /favicon.ico.
    assert re.findall(r"<link\b[^>]*>", TEXT) == ['<link rel="icon" href="data:,">']
    # One inline script, no script loaded from anywhere.
    assert len(re.findall(r"<script\b", TEXT)) == 1 and "<script>" in TEXT


def test_the_policy_allows_exactly_the_page_script() -> None:
    headers = dashboard.headers(PAGE)
    csp = dict(part.strip().split(" ", 1) for part in headers["content-security-policy"].split(";"))
    assert csp["default-src"] == "'none'" and csp["connect-src"] == "'self'"
    assert csp["frame-ancestors"] == "'none'"
    assert "unsafe-inline" not in csp["script-src"]
    assert csp["script-src"].split() == dashboard.script_hashes(PAGE)
    # An edited page gets a different hash: the policy follows the file, not a copy of it.
    edited = PAGE.replace(b"<script>", b"<script>/* edit */", 1)
    assert dashboard.script_hashes(edited) != dashboard.script_hashes(PAGE)


def test_the_page_sets_text_not_markup() -> None:
    # Model names and error messages come from the config and the workers: shown as text.
    assert "innerHTML" not in TEXT and "outerHTML" not in TEXT and "document.write" not in TEXT


def test_the_wheel_ships_the_page() -> None:
    # setuptools leaves out every file that is not a module unless package-data names it.
    pyproject = tomllib.loads((Path(__file__).resolve().parents[4] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["router.server"]
    assert any(fnmatch.fnmatch(f"static/{dashboard.PAGE}", g) for g in globs), globs
