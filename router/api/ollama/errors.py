"""Errors in Ollama's shape: `{"error": "message"}`, with the status every dialect gives
(router/server/errors.py). Ollama's clients raise the message with the status."""

from __future__ import annotations

import msgspec

from router.server.errors import Rendered, headers_of, status_of
from supervisor.errors import CorralError


def render(exc: CorralError) -> Rendered:
    # The parameter at fault is in the message already; Ollama's error has no other field.
    return msgspec.json.encode({"error": exc.message}), status_of(exc), headers_of(exc)


def render_http(status: int, message: str, code: str | None) -> Rendered:
    return msgspec.json.encode({"error": message}), status, {"content-type": "application/json"}
