"""Anthropic's Messages API: /v1/messages (whole or streamed, with thinking and tool use)
and /v1/messages/count_tokens, with Anthropic's error shape on both."""

from __future__ import annotations

from router.api.anthropic import errors, routes, schemas
from router.api.dialect import Dialect
from router.server.openapi import Operation

OPERATIONS = (
    Operation(
        "post", "/v1/messages", "Create a message (Anthropic's Messages API)", schemas.MessagesRequest,
        schemas.AnthropicErrorBody, streams=True,
    ),
    Operation(
        "post", "/v1/messages/count_tokens", "Count a message's input tokens (Anthropic's API)",
        schemas.CountTokensRequest, schemas.AnthropicErrorBody,
    ),
)

DIALECT = Dialect(
    name="anthropic",
    owns=routes.owns,
    render_error=errors.render,
    render_http=errors.render_http,
    register=routes.register,
    operations=OPERATIONS,
)
