"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, as a status
or as a stream's last event. Corral's own routes (admin, metrics) answer in it too."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from router.server import sse
from router.server.errors import Rendered, headers_of, status_of
from supervisor import errors as e
from supervisor.config import ConfigError


@dataclass(frozen=True)
class HttpError:
    status: int
    type: str
    code: str | None


_KIND: dict[type[e.CorralError], tuple[str, str | None]] = {
    e.InvalidRequest: ("invalid_request_error", None),
    e.Unsupported: ("invalid_request_error", "unsupported_parameter"),
    e.ContextOverflow: ("invalid_request_error", "context_length_exceeded"),
    e.Unauthorized: ("invalid_request_error", "invalid_api_key"),
    e.Forbidden: ("invalid_request_error", "insufficient_permissions"),
    e.ModelNotFound: ("invalid_request_error", "model_not_found"),
    e.NotFound: ("invalid_request_error", "not_found"),
    e.Overloaded: ("rate_limit_error", "rate_limit_exceeded"),
    e.QuotaExceeded: ("rate_limit_error", "rate_limit_exceeded"),
    e.WorkerCrashed: ("server_error", "worker_crashed"),
    e.WorkerUnavailable: ("server_error", "model_unavailable"),
    e.InternalError: ("server_error", "internal_error"),
    e.NotServed: ("invalid_request_error", "not_supported"),
    e.InsufficientStorage: ("server_error", "insufficient_storage"),
}


def classify(exc: e.CorralError) -> HttpError:
    for cls in type(exc).__mro__:
        if cls in _KIND:
            return HttpError(status_of(exc), *_KIND[cls])
    return HttpError(500, *_KIND[e.InternalError])


def envelope(message: str, type_: str, param: str | None, code: str | None) -> dict[str, object]:
    # OpenAI always sends all four keys, null where empty; strict clients rely on that.
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def render(exc: e.CorralError) -> Rendered:
    """Body, status and headers for an error response."""
    h = classify(exc)
    return msgspec.json.encode(envelope(exc.message, h.type, exc.param, h.code)), h.status, headers_of(exc)


def error_event(exc: e.CorralError) -> bytes:
    """The final event of a stream that failed after its headers were sent: the same
    error object a 4xx/5xx body would hold, since the status line is already gone."""
    h = classify(exc)
    return sse.event(msgspec.json.encode(envelope(exc.message, h.type, exc.param, h.code)))


def http_status(status: int, message: str, code: str | None = None) -> Rendered:
    """A plain HTTP-level error (404 route, 405, 413) in the same envelope."""
    type_ = "invalid_request_error" if status < 500 else "server_error"
    body = msgspec.json.encode(envelope(message, type_, None, code))
    return body, status, {"content-type": "application/json"}


def render_config_error(exc: ConfigError) -> Rendered:
    """A config that a reload refused: 400 with every problem (the old config runs on)."""
    body, status, headers = http_status(400, "; ".join(exc.problems), "invalid_config")
    # Each problem on its own too: a problem may itself hold "; ", and `corral reload`
    # prints one a line.
    obj = msgspec.json.decode(body)
    obj["error"]["problems"] = list(exc.problems)
    return msgspec.json.encode(obj), status, headers
