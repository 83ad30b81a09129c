"""OpenAI's API: chat completions, completions, embeddings, models and audio
transcriptions (as llama-server serves them), on /v1 and bare.

The default dialect: every path no other dialect owns (Corral's own admin routes too)
answers errors in OpenAI's shape.
"""

from __future__ import annotations

from quart import Blueprint

from router.api.dialect import Dialect, Server
from router.api.openai import errors, routes, schemas, transcriptions
from router.server.openapi import Operation


def _owns(path: str) -> bool:
    return True


def _register(app: Blueprint, server: Server) -> None:
    routes.register(app, server)
    # A multipart form, not a JSON body: not among the OPERATIONS, whose bodies are JSON.
    transcriptions.register(app, server)


# Each route is listed once, with its /v1 prefix; the same route answers without it.
OPERATIONS = (
    Operation("post", "/v1/chat/completions", "Chat completion", schemas.ChatRequest, schemas.ErrorBody, streams=True),
    Operation("post", "/v1/completions", "Text completion", schemas.CompletionRequest, schemas.ErrorBody, streams=True),
    Operation("post", "/v1/embeddings", "Embeddings", schemas.EmbeddingRequest, schemas.ErrorBody),
    Operation("get", "/v1/models", "List the configured models", error=schemas.ErrorBody),
    Operation(
        "get", "/v1/models/{model}", "One model, by name or alias", error=schemas.ErrorBody, path_params=("model",)
    ),
)

DIALECT = Dialect(
    name="openai",
    owns=_owns,
    render_error=errors.render,
    render_http=errors.http_status,
    register=_register,
    operations=OPERATIONS,
)
