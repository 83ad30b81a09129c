"""Errors in llama-server's shape on its own routes: `{"error": {"code", "message", "type"}}`
with the status as `code`, as a status or as a stream's last event."""

from __future__ import annotations

import msgspec

from router.server import sse
from router.server.errors import Rendered, headers_of, status_of
from supervisor import errors as e

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


def render(exc: e.CorralError) -> Rendered:
    """The same status and headers as every dialect's, in llama-server's shape. A context
    overflow is its exceed_context_size_error with the counts it reports."""
    status = status_of(exc)
    obj = native_envelope(status, exc.message, exc.param)
    if isinstance(exc, e.ContextOverflow):
        error = obj["error"]
        assert isinstance(error, dict)
        error["type"] = "exceed_context_size_error"
        if exc.n_prompt_tokens is not None:
            error["n_prompt_tokens"] = exc.n_prompt_tokens
        if exc.n_ctx is not None:
            error["n_ctx"] = exc.n_ctx
    return msgspec.json.encode(obj), status, headers_of(exc)


def render_http(status: int, message: str, code: str | None) -> Rendered:
    """An error before any route ran (a 404, 405, 413), in llama-server's shape."""
    return msgspec.json.encode(native_envelope(status, message, None)), status, {"content-type": "application/json"}


def error_event(exc: e.CorralError) -> bytes:
    """A stream's last event when it failed after its headers."""
    return sse.event(render(exc)[0])
