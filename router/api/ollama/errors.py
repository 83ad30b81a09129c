"""Errors in Ollama's shape: `{"error": "message"}`, with the status every dialect gives
(router/server/errors.py). Ollama's clients raise the message with the status."""

from __future__ import annotations

import msgspec

from router.server.errors import Rendered, headers_of, status_of
from supervisor.errors import CorralError


def message(exc: CorralError) -> str:
    """The message, naming the parameter (or header) at fault: Ollama's error has no other
    field to hold it."""
    if exc.param is not None and exc.param not in exc.message:
        return f"{exc.message} ({exc.param})"
    return exc.message


def render(exc: CorralError) -> Rendered:
    return msgspec.json.encode({"error": message(exc)}), status_of(exc), headers_of(exc)


def render_http(status: int, message: str, code: str | None) -> Rendered:
    return msgspec.json.encode({"error": message}), status, {"content-type": "application/json"}
