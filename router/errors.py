"""The one place that maps errors to HTTP: status, OpenAI error type and code, headers."""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from supervisor import errors as e
from supervisor.config import ConfigError


@dataclass(frozen=True)
class HttpError:
    status: int
    type: str
    code: str | None


_MAP: dict[type[e.CorralError], HttpError] = {
    e.InvalidRequest: HttpError(400, "invalid_request_error", None),
    e.Unsupported: HttpError(400, "invalid_request_error", "unsupported_parameter"),
    e.ContextOverflow: HttpError(400, "invalid_request_error", "context_length_exceeded"),
    e.ModelNotFound: HttpError(404, "invalid_request_error", "model_not_found"),
    e.WorkerCrashed: HttpError(502, "server_error", "worker_crashed"),
    e.WorkerUnavailable: HttpError(503, "server_error", "model_unavailable"),
    e.InternalError: HttpError(500, "server_error", "internal_error"),
}


def classify(exc: e.CorralError) -> HttpError:
    for cls in type(exc).__mro__:
        if cls in _MAP:
            return _MAP[cls]
    return _MAP[e.InternalError]


def envelope(message: str, type_: str, param: str | None, code: str | None) -> dict[str, object]:
    # OpenAI always sends all four keys, null where empty; strict clients rely on that.
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def render(exc: e.CorralError) -> tuple[bytes, int, dict[str, str]]:
    """Body, status and headers for an error response."""
    h = classify(exc)
    headers = {"content-type": "application/json"}
    if isinstance(exc, e.WorkerUnavailable):
        headers["x-should-retry"] = "true" if exc.retry else "false"
        if exc.retry and exc.retry_after is not None:
            headers["retry-after"] = str(max(1, math.ceil(exc.retry_after)))
    body = msgspec.json.encode(envelope(exc.message, h.type, exc.param, h.code))
    return body, h.status, headers


def http_status(status: int, message: str, code: str | None = None) -> tuple[bytes, int, dict[str, str]]:
    """A plain HTTP-level error (404 route, 405, 413) in the same envelope."""
    type_ = "invalid_request_error" if status < 500 else "server_error"
    body = msgspec.json.encode(envelope(message, type_, None, code))
    return body, status, {"content-type": "application/json"}


def render_config_error(exc: ConfigError) -> tuple[bytes, int, dict[str, str]]:
    """A config that a reload refused: 400 with every problem (the old config runs on)."""
    return http_status(400, "; ".join(exc.problems), "invalid_config")


def render_http(
    status: int, method: str, path: str, description: str | None, max_body_bytes: int
) -> tuple[bytes, int, dict[str, str]]:
    """What Werkzeug raises before a route runs (no such route, wrong method, body too
    large), in the same envelope as everything else rather than Werkzeug's HTML."""
    if status == 404:
        msg, code = f"Unknown request URL: {method} {path}", "unknown_url"
    elif status == 405:
        msg, code = f"Method {method} is not allowed on {path}", "method_not_allowed"
    elif status == 413:
        msg, code = f"The request body exceeds {max_body_bytes} bytes", "request_too_large"
    else:
        msg, code = description or "HTTP error", None
    return http_status(status, msg, code)

