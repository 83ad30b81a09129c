"""The HTTP app: the server's parts (router/server/) and one folder per API dialect
(router/api/), over the supervisor.

The server's parts run before any route: the access log, the site guard (a foreign page
or a rebound host name is refused), CORS, keys. Each dialect then adds its routes; an
error anywhere is rendered by the dialect that owns the request's path (the first whose
`owns` takes it; OpenAI's takes every path, Corral's own routes included).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec
from quart import Blueprint, Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from router.api import anthropic, autoload, llama, ollama, openai, responses
from router.api.dialect import Dialect, Server
from router.api.openai.errors import render_config_error
from router.api.openai.schemas import IGNORED
from router.generation import image_urls
from router.server import (
    access_log, adapter_scales, admin, auth, bodies, connections, cors, dashboard, instance_key, metrics, openapi, readiness,
    site_guard,
)
from router.server.errors import Rendered, http_problem
from router.upstream import relay
from router.upstream import service as upstream_service
from router.upstream.metrics import UpstreamCollector
from router.usage import gate as usage_gate
from router.usage import routes as usage_routes
from supervisor.config import Config, ConfigError
from supervisor.errors import CorralError, InternalError
from supervisor.supervisor import Supervisor

log = logging.getLogger("corral.router")
_json = msgspec.json.Encoder()

# In the order their paths are tried; OpenAI's, which owns every path, last.
DIALECTS: tuple[Dialect, ...] = (
    anthropic.DIALECT, responses.DIALECT, llama.DIALECT, ollama.DIALECT, openai.DIALECT,
)


def dialect_of(path: str, v1_errors: str = "openai") -> Dialect:
    """The dialect whose shape an error on `path` takes. With `[server] v1_error_shape =
    "llama-server"`, the OpenAI routes' errors take llama-server's shape, as llama-server
    answers on them (its `exceed_context_size_error` with its counts, among others);
    Corral's own routes keep theirs."""
    dialect = next(d for d in DIALECTS if d.owns(path))
    if v1_errors == "llama-server" and dialect is openai.DIALECT and not _corral_route(path):
        return llama.DIALECT
    return dialect


def _corral_route(path: str) -> bool:
    return path in ("/metrics", "/admin") or path.startswith("/admin/")


def openapi_document() -> dict[str, Any]:
    """GET /openapi.json: every dialect's routes."""
    return openapi.document(
        [op for d in DIALECTS for op in d.operations],
        "OpenAI-compatible API of a Corral server, with llama-server's and Ollama's routes. Fields that "
        "Corral accepts and ignores on the OpenAI routes: " + ", ".join(sorted(IGNORED)) + ".",
    )


def create_app(supervisor: Supervisor, config: Config) -> QuartTrio:
    app = QuartTrio("corral")
    app.request_class = bodies.CorralRequest
    connections.install(app)
    # Werkzeug answers `//admin/models` with an HTML 308 to `/admin/models`, and redirects
    # skip every error handler. An address with doubled slashes is a 404 in JSON instead;
    # serving it would let `//admin/...` slip past any check made on the path's prefix. The
    # matcher reads the setting when the map is built, hence a new map.
    app.url_map = app.url_map_class(merge_slashes=False)
    # Quart ends every response after 60 s by default, silently cutting long streams.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = config.server.max_body_bytes
    access_log.install(app)
    # A relayed answer that broke off at its upstream is logged once, by the relay; the
    # ASGI server's traceback for the same break says nothing more.
    relay.quiet_breaks(logging.getLogger("hypercorn.error"))
    # Before anything runs: a foreign page's request, or a rebound host name, is refused.
    site_guard.install(app, supervisor)
    # Preflights are answered before keys are checked: browsers send none with them.
    cors.install(app, lambda: supervisor.config.server.cors_origins)
    auth.install(app, supervisor)
    # Right after the key check, before any relay: a key's quotas reach upstream models too.
    usage = usage_gate.install(app, supervisor, lambda path: dialect_of(path).name)
    image_urls.install(app, lambda: supervisor.config.server.image_url_hosts)
    # After the key check: a request for a model served elsewhere is relayed from here.
    upstreams = upstream_service.install(app, supervisor, lambda path: dialect_of(path).name)
    # And a request for a model of several instances has its session key read here.
    instance_key.install(app, supervisor)

    @app.errorhandler(CorralError)
    async def on_corral_error(exc: CorralError) -> Response:
        return _error_response(dialect_of(request.path, supervisor.config.server.v1_error_shape).render_error(exc))

    @app.errorhandler(HTTPException)
    async def on_http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        message, code = http_problem(
            status, request.method, request.path, exc.description or exc.name, config.server.max_body_bytes
        )
        return _error_response(
            dialect_of(request.path, supervisor.config.server.v1_error_shape).render_http(status, message, code)
        )

    @app.errorhandler(ConfigError)
    async def on_config_error(exc: ConfigError) -> Response:
        return _error_response(render_config_error(exc))

    @app.errorhandler(Exception)
    async def on_unexpected(exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return await on_corral_error(InternalError(f"internal error: {type(exc).__name__}"))

    @app.get("/health")
    @app.get("/v1/health")  # llama-server's second name for it
    async def health() -> Response:
        model = request.args.get("model")
        if model is not None:  # one model's readiness, for a balancer (router/server/readiness.py)
            if (remote := upstreams.readiness(model)) is not None:
                return remote
            return readiness.model_health(supervisor, model)
        return Response(_json.encode({"status": "ok"}), content_type="application/json")

    spec = _json.encode(openapi_document())  # built from the dialects' request types, once

    @app.get("/openapi.json")
    async def openapi_json() -> Response:
        return Response(spec, content_type="application/json")

    lora_scales = adapter_scales.Scales()  # POST /lora-adapters' (router/server/adapter_scales.py)
    find = auth.scoped_resolve(supervisor, lora_scales)
    server = Server(
        supervisor, autoload.gated(find, supervisor), started=int(time.time()), find=find, upstreams=upstreams.pool,
        lora_scales=lora_scales,
    )
    for d in DIALECTS:
        blueprint = Blueprint(d.name, __name__)
        d.register(blueprint, server)
        app.register_blueprint(blueprint)
    admin.register(app, supervisor, upstreams.view, upstreams.fleet)
    usage_routes.register(app)
    dashboard.register(app)
    metrics.register(app, supervisor, [UpstreamCollector(upstreams.pool), usage_gate.UsageCollector(usage, supervisor)])
    return app


def _error_response(rendered: Rendered) -> Response:
    body, status, headers = rendered
    return Response(body, status=status, headers=headers)
