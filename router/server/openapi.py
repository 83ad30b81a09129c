"""The OpenAPI document that GET /openapi.json serves, generated from the request types.

Each dialect lists its routes as Operations (router/api/*/__init__.py), with the same
msgspec Structs that decode their bodies, so the document cannot drift from what the
server accepts: a new parameter, a bound or an enum shows up here by being declared there.
Each route's errors are its dialect's one generated schema. Response bodies are built as
plain objects and follow each API's published schema, so the document names their shape
only loosely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import msgspec


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    body: type[msgspec.Struct] | None = None
    error: type[msgspec.Struct] | None = None  # the route's error body (its dialect's)
    streams: bool = False  # may answer a stream (when the body asks to stream)
    path_params: tuple[str, ...] = ()
    stream_type: str = "text/event-stream"


_REF = "#/components/schemas/{name}"


def document(operations: Sequence[Operation], description: str, version: str = "0.1.0") -> dict[str, Any]:
    """The document of `operations` (every dialect's routes, each listed once)."""
    kinds: list[type[msgspec.Struct]] = []
    for op in operations:
        kinds += [k for k in (op.body, op.error) if k is not None and k not in kinds]
    refs, components = msgspec.json.schema_components(kinds, ref_template=_REF)
    by_type = dict(zip(kinds, refs))
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        error = {"application/json": {"schema": by_type[op.error] if op.error is not None else {"type": "object"}}}
        ok: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
        if op.streams:
            ok[op.stream_type] = {"schema": {"type": "string"}}
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
            "description": description,
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
