"""The one place that maps errors to HTTP: status, OpenAI error type and code, headers."""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from supervisor import errors as e


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


def sse_event(exc: e.CorralError) -> bytes:
    """The final event of a stream that failed after its headers were sent."""
    h = classify(exc)
    return b"data: " + msgspec.json.encode(envelope(exc.message, h.type, exc.param, h.code)) + b"\n\n"


def http_status(status: int, message: str, code: str | None = None) -> tuple[bytes, int, dict[str, str]]:
    """A plain HTTP-level error (404 route, 405, 413) in the same envelope."""
    type_ = "invalid_request_error" if status < 500 else "server_error"
    body = msgspec.json.encode(envelope(message, type_, None, code))
    return body, status, {"content-type": "application/json"}
