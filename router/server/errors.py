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
    e.Unauthorized: HttpError(401, "invalid_request_error", "invalid_api_key"),
    e.Forbidden: HttpError(403, "invalid_request_error", "insufficient_permissions"),
    e.ModelNotFound: HttpError(404, "invalid_request_error", "model_not_found"),
    e.Overloaded: HttpError(429, "rate_limit_error", "rate_limit_exceeded"),
    e.WorkerCrashed: HttpError(502, "server_error", "worker_crashed"),
    e.WorkerUnavailable: HttpError(503, "server_error", "model_unavailable"),
    e.InternalError: HttpError(500, "server_error", "internal_error"),
}


def classify(exc: e.CorralError) -> HttpError:
    for cls in type(exc).__mro__:
        if cls in _MAP:
            return _MAP[cls]
    return _MAP[e.InternalError]


def _retry_after(seconds: float) -> dict[str, str]:
    """Retry-After in whole seconds (RFC 9110), and retry-after-ms, which the openai
    clients read first, for waits shorter than a second's rounding."""
    return {"retry-after": str(max(1, math.ceil(seconds))), "retry-after-ms": str(max(1, round(seconds * 1000)))}


def envelope(message: str, type_: str, param: str | None, code: str | None) -> dict[str, object]:
    # OpenAI always sends all four keys, null where empty; strict clients rely on that.
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def render(exc: e.CorralError) -> tuple[bytes, int, dict[str, str]]:
    """Body, status and headers for an error response."""
    h = classify(exc)
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
    body = msgspec.json.encode(envelope(exc.message, h.type, exc.param, h.code))
    return body, h.status, headers


# llama-server's error `type` for each status it uses (tools/server's error_type); a status
# it never sends reads as its nearest.
_NATIVE_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "unavailable_error",  # llama-server sends no 429; its nearest is "unavailable"
    501: "not_supported_error",
    503: "unavailable_error",
}


def native_envelope(status: int, message: str, param: str | None) -> dict[str, object]:
    """llama-server's error object: the status as `code`, its type, the message. `param`
    is Corral's addition (the parameter to fix); clients of llama-server ignore it."""
    type_ = _NATIVE_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    error: dict[str, object] = {"code": status, "message": message, "type": type_}
    if param is not None:
        error["param"] = param
    return {"error": error}


def render_native(exc: e.CorralError) -> tuple[bytes, int, dict[str, str]]:
    """`render` for llama-server's own routes: the same status and headers, in its shape.
    A context overflow is its exceed_context_size_error with the counts it reports."""
    _, status, headers = render(exc)
    obj = native_envelope(status, exc.message, exc.param)
    if isinstance(exc, e.ContextOverflow):
        error = obj["error"]
        assert isinstance(error, dict)
        error["type"] = "exceed_context_size_error"
        if exc.n_prompt_tokens is not None:
            error["n_prompt_tokens"] = exc.n_prompt_tokens
        if exc.n_ctx is not None:
            error["n_ctx"] = exc.n_ctx
    return msgspec.json.encode(obj), status, headers


def to_native(rendered: tuple[bytes, int, dict[str, str]]) -> tuple[bytes, int, dict[str, str]]:
    """An error already rendered in OpenAI's envelope (a 404, 405, 413 before any route
    ran), in llama-server's shape instead."""
    body, status, headers = rendered
    error = msgspec.json.decode(body).get("error", {})
    obj = native_envelope(status, str(error.get("message", "")), error.get("param"))
    return msgspec.json.encode(obj), status, headers


def http_status(status: int, message: str, code: str | None = None) -> tuple[bytes, int, dict[str, str]]:
    """A plain HTTP-level error (404 route, 405, 413) in the same envelope."""
    type_ = "invalid_request_error" if status < 500 else "server_error"
    body = msgspec.json.encode(envelope(message, type_, None, code))
    return body, status, {"content-type": "application/json"}


def render_config_error(exc: ConfigError) -> tuple[bytes, int, dict[str, str]]:
    """A config that a reload refused: 400 with every problem (the old config runs on)."""
    body, status, headers = http_status(400, "; ".join(exc.problems), "invalid_config")
    # Each problem on its own too: a problem may itself hold "; ", and `corral reload`
    # prints one a line.
    obj = msgspec.json.decode(body)
    obj["error"]["problems"] = list(exc.problems)
    return msgspec.json.encode(obj), status, headers


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

