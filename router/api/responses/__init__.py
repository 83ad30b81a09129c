"""OpenAI's Responses API: /v1/responses (whole or streamed, with function tools,
structured output and `previous_response_id`), GET and DELETE of a kept response, and
/v1/responses/input_tokens; OpenAI's error shape, and `response.failed` in a stream."""

from __future__ import annotations

from router.api.dialect import Dialect
from router.api.openai.schemas import ErrorBody
from router.api.responses import errors, routes, schemas
from router.server.openapi import Operation

_E = ErrorBody  # OpenAI's
OPERATIONS = (
    Operation("post", "/v1/responses", "Create a response (OpenAI's Responses API)", schemas.ResponsesRequest, _E, streams=True),
    Operation(
        "post", "/v1/responses/input_tokens", "Count a response's input tokens (OpenAI's Responses API)",
        schemas.ResponsesRequest, _E,
    ),
    Operation("get", "/v1/responses/{response_id}", "A kept response", error=_E, path_params=("response_id",)),
    Operation("delete", "/v1/responses/{response_id}", "Forget a kept response", error=_E, path_params=("response_id",)),
)

DIALECT = Dialect(
    name="responses",
    owns=routes.owns,
    render_error=errors.render,
    render_http=errors.render_http,
    register=routes.register,
    operations=OPERATIONS,
)
