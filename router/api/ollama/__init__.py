"""Ollama's API: /api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/embed,
/api/embeddings, /api/version; NDJSON streams, `options`, `keep_alive`, and its error
shape on every /api/ path."""

from __future__ import annotations

from router.api.dialect import Dialect
from router.api.ollama import errors, routes, schemas
from router.server.openapi import Operation

_E = schemas.OllamaErrorBody
_NDJSON = "application/x-ndjson"

OPERATIONS = (
    Operation("post", "/api/chat", "Chat (Ollama's API)", schemas.OllamaChatRequest, _E, streams=True, stream_type=_NDJSON),
    Operation(
        "post", "/api/generate", "Generate from a prompt (Ollama's API)", schemas.OllamaGenerateRequest, _E, streams=True,
        stream_type=_NDJSON,
    ),
    Operation("get", "/api/tags", "List the models (Ollama's API)", error=_E),
    Operation("post", "/api/show", "One model's details (Ollama's API)", schemas.OllamaShowRequest, _E),
    Operation("get", "/api/ps", "The loaded models (Ollama's API)", error=_E),
    Operation("post", "/api/embed", "Embeddings (Ollama's API)", schemas.OllamaEmbedRequest, _E),
    Operation("post", "/api/embeddings", "One embedding (Ollama's older API)", schemas.OllamaEmbeddingsRequest, _E),
    Operation("get", "/api/version", "The Ollama API version served", error=_E),
)

DIALECT = Dialect(
    name="ollama",
    owns=routes.owns,
    render_error=errors.render,
    render_http=errors.render_http,
    register=routes.register,
    operations=OPERATIONS,
)
