"""llama-server's routes for features Corral does not have, answered as llama-server
answers them with the feature off, so that its clients read the same refusal (not a 404
that looks like a wrong address):

- POST /props: llama-server changes nothing there even with `--props`; without it, 501.
- /cors-proxy (its web UI's MCP proxy) and /tools (server-side tools): 403
  `feature_disabled`, llama-server's answer without `--webui-mcp-proxy` and `--tools`
  (tools/server/server.cpp, res_403).
"""

from __future__ import annotations

import msgspec
from quart import Blueprint, Response

from router.api.dialect import Server
from supervisor.errors import NotServed

PATHS = frozenset({"/props", "/cors-proxy", "/tools"})

_DISABLED = msgspec.json.encode({"error": {"message": "this feature is disabled", "type": "feature_disabled"}})


def register(app: Blueprint, server: Server) -> None:
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
