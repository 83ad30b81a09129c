"""The OpenAPI document that GET /openapi.json serves, generated from the request types.

Request bodies are described by the same msgspec Structs that decode them (router/api/openai/schemas.py),
so the document cannot drift from what the server accepts: a new parameter, a bound or an
enum shows up here by being declared there. Error answers share one generated schema too.
Response bodies are built as plain objects (router/api/openai/render.py) and follow OpenAI's own
published schema, so the document names their shape only loosely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from router.api.llama import schemas as native_schemas
from router.api.openai import schemas


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(msgspec.Struct):
    """Every 4xx and 5xx on the OpenAI routes (router/server/errors.py builds it)."""

    error: ErrorDetail


class NativeErrorDetail(msgspec.Struct):
    code: int  # the HTTP status, as llama-server writes it
    message: str
    type: str
    param: str | None = None  # Corral's addition: the parameter to fix
    n_prompt_tokens: int | None = None  # exceed_context_size_error only
    n_ctx: int | None = None


class NativeErrorBody(msgspec.Struct):
    """Every error on llama-server's own routes (router/server/errors.py, native_envelope)."""

    error: NativeErrorDetail


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    body: type[msgspec.Struct] | None = None
    streams: bool = False  # may answer text/event-stream (when the body asks to stream)
    path_params: tuple[str, ...] = ()
    native: bool = False  # llama-server's route: its error shape, not OpenAI's


# Each route is listed once, with its /v1 prefix; the same route answers without it.
OPERATIONS: tuple[Operation, ...] = (
    Operation("post", "/v1/chat/completions", "Chat completion", schemas.ChatRequest, streams=True),
    Operation("post", "/v1/completions", "Text completion", schemas.CompletionRequest, streams=True),
    Operation("post", "/v1/embeddings", "Embeddings", schemas.EmbeddingRequest),
    Operation("get", "/v1/models", "List the configured models"),
    Operation("get", "/v1/models/{model}", "One model, by name or alias", path_params=("model",)),
    Operation("post", "/completion", "llama-server's completion", native_schemas.NativeCompletionRequest,
              streams=True, native=True),
    Operation("post", "/tokenize", "Tokenize a text (llama-server's route)", schemas.TokenizeRequest, native=True),
    Operation("post", "/detokenize", "Token ids to text (llama-server's route)", native_schemas.DetokenizeRequest,
              native=True),
    Operation("post", "/apply-template", "Render a chat with the model's template (llama-server's route)",
              native_schemas.ApplyTemplateRequest, native=True),
)

_REF = "#/components/schemas/{name}"


def document(version: str = "0.1.0") -> dict[str, Any]:
    bodies = [op.body for op in OPERATIONS if op.body is not None]
    kinds = [*bodies, ErrorBody, NativeErrorBody]
    refs, components = msgspec.json.schema_components(kinds, ref_template=_REF)
    by_type = dict(zip(kinds, refs))
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        error = {"application/json": {"schema": by_type[NativeErrorBody if op.native else ErrorBody]}}
        ok: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
        if op.streams:
            ok["text/event-stream"] = {"schema": {"type": "string"}}
        entry: dict[str, Any] = {
            "summary": op.summary,
            "operationId": f"{op.method}_{op.path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
            "responses": {
                "200": {"description": "Success", "content": ok},
                "4XX": {"description": "A client error, in the route's error JSON", "content": error},
                "5XX": {"description": "A server or worker error, in the same JSON", "content": error},
            },
        }
        if op.body is not None:
            entry["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": by_type[op.body]}},
            }
        if op.path_params:
            entry["parameters"] = [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                for p in op.path_params
            ]
        paths.setdefault(op.path, {})[op.method] = entry
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Corral",
            "version": version,
            "description": "OpenAI-compatible API of a Corral server. Fields that Corral "
            "accepts and ignores: " + ", ".join(sorted(schemas.IGNORED)) + ".",
        },
        "paths": paths,
        # A key, once the server has any (router/server/auth.py); `{}`: a server without keys.
        "security": [{"bearer": []}, {"x-api-key": []}, {}],
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }
