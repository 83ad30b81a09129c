"""Errors in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`, with
the status every dialect gives (router/server/errors.py), as a response or as a stream's
`error` event.

Anthropic's error has no field for the parameter, so the message names it (Corral's
messages do). Its types follow the status, as Anthropic's API reference lists them; a 503
(a model that cannot load now) is its `overloaded_error`, which its SDKs retry like 529.
"""

from __future__ import annotations

import msgspec

from router.server.errors import Rendered, headers_of, status_of
from supervisor.errors import CorralError

_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    501: "invalid_request_error",
    503: "overloaded_error",
}


def error_type(status: int) -> str:
    return _TYPE.get(status, "api_error" if status >= 500 else "invalid_request_error")


def message(exc: CorralError) -> str:
    if exc.param is not None and exc.param not in exc.message:
        return f"{exc.message} ({exc.param})"
    return exc.message


def body(status: int, text: str) -> dict[str, object]:
    return {"type": "error", "error": {"type": error_type(status), "message": text}}


def render(exc: CorralError) -> Rendered:
    status = status_of(exc)
    return msgspec.json.encode(body(status, message(exc))), status, headers_of(exc)


def render_http(status: int, text: str, code: str | None) -> Rendered:
    return msgspec.json.encode(body(status, text)), status, {"content-type": "application/json"}


def error_event(exc: CorralError) -> bytes:
    """A stream's last event when the answer broke after its headers: Anthropic's
    `error` event, which its SDKs raise."""
    data = msgspec.json.encode(body(status_of(exc), message(exc)))
    return b"event: error\ndata: " + data + b"\n\n"
