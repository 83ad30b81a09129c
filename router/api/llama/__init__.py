"""llama-server's own API: /completion, /tokenize, /detokenize, /apply-template, /props,
/slots, /embedding, /rerank and router mode's /models/load and /models/unload, with its
request names and its error shape."""

from __future__ import annotations

from quart import Blueprint

from router.api.dialect import Dialect, Server
from router.api.llama import errors, features_off, lora_routes, routes, schemas, slot_files
from router.server.openapi import Operation

_E = schemas.NativeErrorBody

OPERATIONS = (
    Operation("post", "/completion", "llama-server's completion", schemas.NativeCompletionRequest, _E, streams=True),
    Operation("post", "/completions", "llama-server's completion (as /completion)", schemas.NativeCompletionRequest, _E, streams=True),
    Operation("post", "/infill", "Fill in the middle (llama-server's route)", schemas.InfillRequest, _E, streams=True),
    Operation("post", "/tokenize", "Tokenize a text (llama-server's route)", schemas.TokenizeRequest, _E),
    Operation("post", "/detokenize", "Token ids to text (llama-server's route)", schemas.DetokenizeRequest, _E),
    Operation(
        "post", "/apply-template", "Render a chat with the model's template (llama-server's route)",
        schemas.ApplyTemplateRequest, _E,
    ),
    Operation("post", "/embedding", "Embeddings in llama-server's native shape (also /embeddings)", schemas.NativeEmbeddingRequest, _E),
    Operation("post", "/rerank", "Rerank documents (llama-server's route; also /v1/rerank)", schemas.RerankRequest, _E),
    Operation("post", "/models/load", "Load a model (llama-server's router mode)", schemas.ModelActionRequest, _E),
    Operation("post", "/models/unload", "Unload a model (llama-server's router mode)", schemas.ModelActionRequest, _E),
)



def _owns(path: str) -> bool:
    return routes.owns(path) or path in features_off.PATHS or path in lora_routes.PATHS or path.startswith("/slots/")


def _register(app: Blueprint, server: Server) -> None:
    routes.register(app, server)
    features_off.register(app, server)
    lora_routes.register(app, server)
    slot_files.register(app, server)


DIALECT = Dialect(
    name="llama",
    owns=_owns,
    render_error=errors.render,
    render_http=errors.render_http,
    register=_register,
    operations=OPERATIONS,
)
