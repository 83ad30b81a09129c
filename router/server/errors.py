"""Errors at the HTTP border, before any dialect's shape: each error's status and headers,
and the words for what Werkzeug refuses before a route runs.

Every dialect renders the body in its own shape (router/api/*/errors.py); the status and
the headers are the same in all of them, so a client's retry logic reads the same signals
whichever API it speaks.
"""

from __future__ import annotations

import math

from supervisor import errors as e

# A rendered error: body, status, headers.
Rendered = tuple[bytes, int, dict[str, str]]

_STATUS: dict[type[e.CorralError], int] = {
    e.InvalidRequest: 400,
    e.Unsupported: 400,
    e.ContextOverflow: 400,
    e.Unauthorized: 401,
    e.Forbidden: 403,
    e.NotFound: 404,
    e.ModelNotFound: 404,
    e.Overloaded: 429,
    e.QuotaExceeded: 429,
    e.WorkerCrashed: 502,
    e.WorkerUnavailable: 503,
    e.InternalError: 500,
    e.NotServed: 501,
    e.InsufficientStorage: 507,
}


def status_of(exc: e.CorralError) -> int:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 500


def _retry_after(seconds: float) -> dict[str, str]:
    """Retry-After in whole seconds (RFC 9110), and retry-after-ms, which the openai
    clients read first, for waits shorter than a second's rounding."""
    return {"retry-after": str(max(1, math.ceil(seconds))), "retry-after-ms": str(max(1, round(seconds * 1000)))}


def headers_of(exc: e.CorralError) -> dict[str, str]:
    """The headers of an error response: JSON, the auth challenge of a 401, and whether
    and when to retry (the openai and anthropic clients read x-should-retry)."""
    headers = {"content-type": "application/json"}
    if isinstance(exc, e.Unauthorized):
        headers["www-authenticate"] = 'Bearer realm="corral"'
    if isinstance(exc, e.WorkerUnavailable):
        headers["x-should-retry"] = "true" if exc.retry else "false"
        if exc.retry and exc.retry_after is not None:
            headers.update(_retry_after(exc.retry_after))
    if isinstance(exc, e.Overloaded):
        headers["x-should-retry"] = "true"
        headers.update(_retry_after(exc.retry_after))
    return headers


def http_problem(
    status: int, method: str, path: str, description: str | None, max_body_bytes: int
) -> tuple[str, str | None]:
    """What Werkzeug raises before a route runs (no such route, wrong method, body too
    large), as a message and a code, for the dialect to shape rather than Werkzeug's HTML."""
    if status == 404:
        return f"Unknown request URL: {method} {path}", "unknown_url"
    if status == 405:
        return f"Method {method} is not allowed on {path}", "method_not_allowed"
    if status == 413:
        return f"The request body exceeds {max_body_bytes} bytes", "request_too_large"
    return description or "HTTP error", None
