"""llama-server's routes for features Corral does not have, answered as llama-server
answers them with the feature off, so that its clients read the same refusal (not a 404
that looks like a wrong address):

- POST /props: llama-server changes nothing there even with `--props`; without it, 501.
- /cors-proxy (its web UI's MCP proxy) and /tools (server-side tools): 403
  `feature_disabled`, llama-server's answer without `--webui-mcp-proxy` and `--tools`
  (tools/server/server.cpp, res_403).
- /lora-adapters: no adapters are loaded, so GET lists none; POST takes llama-server's body
  (an array of `{id, scale}`) and answers as it does, but an id that names no adapter is a
  400 naming it (llama-server skips it silently).
"""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Blueprint, Response, request

from router.api.dialect import Server
from router.server import bodies, json_body
from supervisor.errors import InvalidRequest, NotServed

PATHS = frozenset({"/props", "/cors-proxy", "/tools", "/lora-adapters"})

_DISABLED = msgspec.json.encode({"error": {"message": "this feature is disabled", "type": "feature_disabled"}})


def _json(obj: object) -> Response:
    return Response(msgspec.json.encode(obj), status=200, content_type="application/json")


def register(app: Blueprint, server: Server) -> None:
    resolve = server.find  # nothing here loads a model

    @app.post("/props")
    async def change_props() -> Response:
        raise NotServed(
            "This server does not support changing global properties. Start it with `--props` "
            "(Corral: a model's settings are its config's; edit it and reload)."
        )

    @app.get("/cors-proxy")
    @app.post("/cors-proxy")
    @app.get("/tools")
    @app.post("/tools")
    async def disabled() -> Response:
        return Response(_DISABLED, status=403, content_type="application/json")

    @app.get("/lora-adapters")
    async def lora_adapters() -> Response:
        resolve(request.args.get("model"))  # an unknown model is a 404 here too
        return _json([])

    @app.post("/lora-adapters")
    async def set_lora_adapters() -> Response:
        resolve(request.args.get("model"))
        entries: Any = json_body.decode_any(await bodies.read_body(), api="llama-server")
        if not isinstance(entries, list):
            raise InvalidRequest("Request body must be an array", None)
        for i, entry in enumerate(entries):
            adapter = entry.get("id", -1) if isinstance(entry, dict) else entry
            raise InvalidRequest(
                f"[{i}].id: no LoRA adapter has id {adapter!r}: this model has none loaded.", "id"
            )
        return _json({"success": True})
