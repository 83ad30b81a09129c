"""Errors on the Responses routes: OpenAI's shape (router/api/openai/errors.py), with the
Responses API's own codes, and a stream's failure as its `response.failed` event
(router/api/responses/render.py)."""

from __future__ import annotations

import msgspec

from router.api.openai import errors as openai_errors
from router.server.errors import Rendered, headers_of, status_of
from supervisor.errors import CorralError, InvalidRequest, NotFound


class PreviousNotFound(InvalidRequest):
    """`previous_response_id` names no response kept for this key (400, OpenAI's
    previous_response_not_found)."""


class ResponseNotFound(NotFound):
    """GET or DELETE of a response not kept for this key (404)."""


def render(exc: CorralError) -> Rendered:
    if isinstance(exc, (PreviousNotFound, ResponseNotFound)):
        code = "previous_response_not_found" if isinstance(exc, PreviousNotFound) else None
        body = openai_errors.envelope(exc.message, "invalid_request_error", exc.param, code)
        return msgspec.json.encode(body), status_of(exc), headers_of(exc)
    return openai_errors.render(exc)


render_http = openai_errors.http_status
