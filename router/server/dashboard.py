"""The dashboard at `/`: one static page (router/server/static/dashboard.html) that shows every
model and drives the admin routes from the browser.

The page holds no data, so it is served to anyone (router/server/auth.py: `/` is open); its
script reads /admin/* and /v1/* with fetch, sending the admin key as a header, and those
routes keep their own rules. A browser cannot send a header with a page navigation, so a
page behind the key could never be opened.

The Content-Security-Policy lets the page run its own script and nothing else: no other
origin, no injected inline script (the script is allowed by its hash, not by
'unsafe-inline'), no framing. Model names and error messages are shown as text, never as
markup, but the policy still holds if a later edit slips.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

from quart import Response
from quart_trio import QuartTrio

PAGE = "dashboard.html"
_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.S)


def page() -> bytes:
    """The page's bytes, as shipped in the package."""
    return (resources.files("router.server") / "static" / PAGE).read_bytes()


def script_hashes(html: bytes) -> list[str]:
    """CSP sources ('sha256-...') for each inline script of `html`."""
    return [
        "'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'"
        for body in _SCRIPT.findall(html)
    ]


def headers(html: bytes) -> dict[str, str]:
    csp = "; ".join(
        [
            "default-src 'none'",
            "script-src " + " ".join(script_hashes(html)),
            "style-src 'unsafe-inline'",
            "connect-src 'self'",
            "img-src 'self' data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    return {
        "content-type": "text/html; charset=utf-8",
        "content-security-policy": csp,
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        # A new version of Corral serves a new page: never keep a stale one.
        "cache-control": "no-cache",
    }


def register(app: QuartTrio) -> None:
    body = page()  # read once: a missing file fails at start, not at the first visit
    fixed = headers(body)

    @app.get("/")
    async def dashboard() -> Response:
        return Response(body, status=200, headers=fixed)
