"""CORS: which browser pages may call Corral, from `[server] cors_origins`.

Off by default: no response carries Access-Control-Allow-Origin, so a page on another site
cannot read an answer; router/server/site_guard.py refuses its requests before they run. An
entry is "*", an origin, or a host pattern as llama-server's --cors-origins takes one
("localhost", "chat.example", ".example.com"; site_guard.origin_allowed). With origins
configured (read at each request, so a reload applies them):
- every preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered 200
  before any key is checked, since browsers never send credentials on a preflight, as
  llama-server answers them; only one from an allowed origin carries the allowing headers:
  its origin, the methods, the headers the page asked for (the openai JS client sends its
  own x-stainless-* headers), for 10 minutes. A page of any other origin reads no
  allowance, and its browser sends nothing more.
- every other response to an allowed origin, errors included, carries the origin, so the
  page can read a 401 or a 429 and its Retry-After.

The origin is echoed, never "*": a page that sends credentials (llama-server allows them)
is refused a wildcard by its browser. Written here rather than taken from quart-cors: the
preflight must be answered ahead of the key check, which that extension's hooks would run
after. Pure except `install`.
"""

from __future__ import annotations

from typing import Callable, Sequence

from quart import Response, request
from quart_trio import QuartTrio

from router.server.site_guard import origin_allowed

METHODS = "GET, POST, DELETE, OPTIONS"
# What a page may read besides the CORS-safelisted headers.
EXPOSED = "retry-after, x-request-id, x-should-retry, x-corral-skipped-tools"
MAX_AGE = "600"


def allowed(origin: str | None, origins: Sequence[str]) -> str | None:
    """The Access-Control-Allow-Origin value for a request from `origin`, or None."""
    if origin is None or not origins:
        return None
    return origin if origin_allowed(origin, origins, None) else None


def preflight_headers(allow: str, requested_headers: str | None) -> dict[str, str]:
    headers = {
        "access-control-allow-origin": allow,
        "access-control-allow-methods": METHODS,
        "access-control-allow-credentials": "true",
        "access-control-max-age": MAX_AGE,
        "vary": "Origin",
    }
    if requested_headers:
        headers["access-control-allow-headers"] = requested_headers
    return headers


def install(app: QuartTrio, origins: Callable[[], Sequence[str]]) -> None:
    """Answer preflights and mark responses for the origins `origins()` gives now.
    Registered before the key check (router/server/auth.py), so a preflight never meets it."""

    @app.before_request
    async def preflight() -> Response | None:
        if request.method != "OPTIONS" or "access-control-request-method" not in request.headers:
            return None
        allow = allowed(request.headers.get("origin"), origins())
        if allow is None:
            return Response(b"", status=200, headers={"vary": "Origin"})  # allows nothing
        headers = preflight_headers(allow, request.headers.get("access-control-request-headers"))
        return Response(b"", status=200, headers=headers)

    @app.after_request
    async def mark(response: Response) -> Response:
        allow = allowed(request.headers.get("origin"), origins())
        if allow is not None and "access-control-allow-origin" not in response.headers:
            response.headers["access-control-allow-origin"] = allow
            response.headers["access-control-expose-headers"] = EXPOSED
            response.headers.add("vary", "Origin")
        return response
