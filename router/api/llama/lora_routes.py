"""llama-server's /lora-adapters, per served name (`?model=`, else the default model).

- GET lists the name's adapters as llama-server does: `id`, `path`, `scale` (the scale a
  request that names none gets now), `task_name`, `prompt_prefix`. `path` is the file's
  name, not where it lies: any key may list them, and a path tells a client nothing it
  can use while it maps the server's folders.
- POST sets those scales, llama-server's way: an array of `{id, scale}`, every adapter
  not named at 0. An operator's action: it changes what every key's requests decode
  under, so it needs an admin key (router/server/auth.py). An id the name has not is a 400
  naming it (llama-server skips it silently).
A model served elsewhere has no adapters here: GET lists none, POST refuses any id.
"""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Blueprint, Response, request

from router.api.dialect import Server
from router.generation import adapters
from router.server import adapter_scales, bodies, json_body
from supervisor.errors import InvalidRequest

PATHS = frozenset({"/lora-adapters"})


def _json(obj: object) -> Response:
    return Response(msgspec.json.encode(obj), status=200, content_type="application/json")


def register(app: Blueprint, server: Server) -> None:
    find = server.find  # nothing here loads a model

    @app.get("/lora-adapters")
    async def lora_adapters() -> Response:
        find(request.args.get("model"))  # an unknown model is a 404 here too
        applying = adapter_scales.current()
        if applying is None:
            return _json([])
        return _json([
            {"id": i, "path": a.path.name, "scale": scale, "task_name": a.task_name, "prompt_prefix": a.prompt_prefix}
            for i, (a, scale) in enumerate(zip(applying.view.adapters, applying.scales))
        ])

    @app.post("/lora-adapters")
    async def set_lora_adapters() -> Response:
        find(request.args.get("model"))
        entries: Any = json_body.decode_any(await bodies.read_body(), api="llama-server")
        if not isinstance(entries, list):
            raise InvalidRequest("Request body must be an array", None)
        asked = adapters.requested(entries, "id", where="") or ()
        applying = adapter_scales.current()
        if applying is None:
            adapter_scales.check_ids(None, asked, "", "id")
        else:
            server.lora_scales.put(applying.view, asked)
        return _json({"success": True})
