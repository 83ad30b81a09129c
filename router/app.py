"""The HTTP app: OpenAI routes over the supervisor.

Each inference route resolves the model (404 before any load), validates the body (400
naming the parameter), takes a lease on the model's worker (loading it if needed), and
waits for the worker's first answer before sending headers, so that a prompt that does not
fit is a clean 400 rather than a broken stream. Streams end with `data: [DONE]`; a failure
after the headers is a final `data: {"error": ...}` event.
"""

from __future__ import annotations

import base64
import logging
import struct
import time

import msgspec
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from router.server import access_log
from router.server import admin
from router.server import auth
from router.server import bodies
from router.server import connections
from router.server import cors
from router.server import dashboard
from router.server import metrics
from router.api.llama import routes as native
from router.server import openapi
from router.api.openai import fields as request_fields
from router.api.openai import schemas
from router.server import site_guard
from router.server import sse
from router.server.errors import render, render_config_error, render_http, render_native, to_native
from router.generation.run import Generation, GenerationJob, chat_job, completion_job, events, whole
from router.api.openai.render import Completion
from supervisor.config import Config, ConfigError
from supervisor.errors import CorralError, InternalError, InvalidRequest, Unsupported
from supervisor.handle import ModelHandle
from supervisor.lifecycle import State
from supervisor.supervisor import Supervisor

log = logging.getLogger("corral.router")
_json = msgspec.json.Encoder()


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
    started = int(time.time())
    access_log.install(app)
    # Before anything runs: a foreign page's request, or a rebound host name, is refused.
    site_guard.install(app, supervisor)
    # Preflights are answered before keys are checked: browsers send none with them.
    cors.install(app, lambda: supervisor.config.server.cors_origins)
    auth.install(app, supervisor)
    resolve = auth.scoped_resolve(supervisor)  # the models the request's key may use

    def json_response(obj: object, status: int = 200) -> Response:
        return Response(_json.encode(obj), status=status, content_type="application/json")

    # Every error becomes a response in router/server/errors.py; these only pick which mapping.
    # llama-server's own routes answer errors in its shape (router/api/llama/routes.py); the rest in
    # OpenAI's.
    @app.errorhandler(CorralError)
    async def on_corral_error(exc: CorralError) -> Response:
        return _error_response(render_native(exc) if native.is_native(request.path) else render(exc))

    @app.errorhandler(HTTPException)
    async def on_http_error(exc: HTTPException) -> Response:
        rendered = render_http(
            exc.code or 500, request.method, request.path, exc.description or exc.name,
            config.server.max_body_bytes,
        )
        return _error_response(to_native(rendered) if native.is_native(request.path) else rendered)

    @app.errorhandler(ConfigError)
    async def on_config_error(exc: ConfigError) -> Response:
        return _error_response(render_config_error(exc))

    @app.errorhandler(Exception)
    async def on_unexpected(exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return await on_corral_error(InternalError(f"internal error: {type(exc).__name__}"))

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok"})

    spec = _json.encode(openapi.document())  # built from the request types, once

    @app.get("/openapi.json")
    async def openapi_json() -> Response:
        return Response(spec, content_type="application/json")

    def model_entry(h: ModelHandle) -> dict[str, object]:
        entry: dict[str, object] = {
            "id": h.name,
            "object": "model",
            "created": started,
            "owned_by": "corral",
            "aliases": list(h.spec.aliases),
            "state": h.state.value,
        }
        if h.state in (State.FAILED, State.BACKOFF):
            entry["last_error"] = h.last_error  # why, where a client looks first
        return entry

    # Every OpenAI route also answers without its /v1 prefix, as llama-server's do: clients
    # configured with a bare base URL (http://host:8080) then work unchanged.
    @app.get("/v1/models")
    @app.get("/models")
    async def list_models() -> Response:
        data = [model_entry(h) for h in supervisor.handles.values() if auth.visible(h)]
        return json_response({"object": "list", "data": data})

    @app.get("/v1/models/<path:model>")
    @app.get("/models/<path:model>")
    async def retrieve_model(model: str) -> Response:
        """The openai client's `models.retrieve`: a name or an alias, answered with the
        model it names. Loads nothing."""
        return json_response(model_entry(resolve(model)))

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions() -> Response:
        r: schemas.ChatRequest = schemas.decode(await bodies.read_body(), schemas.ChatRequest)
        handle = _generating_model(r.model)  # 404 before the body's own checks, as OpenAI does
        return await _generate(handle, chat_job(r, r.model or handle.name, handle.spec.max_tokens))

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions() -> Response:
        r: schemas.CompletionRequest = schemas.decode(await bodies.read_body(), schemas.CompletionRequest)
        handle = _generating_model(r.model)
        return await _generate(handle, completion_job(r, r.model or handle.name, handle.spec.max_tokens))

    def _generating_model(model: str | None) -> ModelHandle:
        handle = resolve(model)
        if handle.spec.embeddings:
            raise Unsupported(
                f"The model `{model or handle.name}` serves embeddings only; use /v1/embeddings.", "model"
            )
        return handle

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings() -> Response:
        r: schemas.EmbeddingRequest = schemas.decode(await bodies.read_body(), schemas.EmbeddingRequest)
        handle = resolve(r.model)
        if not handle.spec.embeddings:
            raise Unsupported(
                f"The model `{r.model or handle.name}` does not serve embeddings "
                "(set embeddings = true).",
                "model",
            )
        inputs = request_fields.embedding_inputs(r)
        record = access_log.current()
        asked = time.monotonic()
        async with handle.lease() as conn:
            # In the model's slot line like a generation (max_queue's 429, queue_timeout's
            # 503): an input a slot, up to all of them. A client that leaves is dropped from
            # the line, or its job is cancelled in the worker within one batch.
            leased = time.monotonic()
            ticket = await handle.take_slots(conn, len(inputs))
            if record is not None:
                record.load_wait, record.slot_wait = leased - asked, time.monotonic() - leased
            try:
                if inputs and isinstance(inputs[0], tuple):
                    result = await conn.embed([], tokens=[list(x) for x in inputs])
                else:
                    result = await conn.embed([x for x in inputs if isinstance(x, str)])
            finally:
                ticket.release()
        data = [
            {"object": "embedding", "index": i, "embedding": _encode_vector(v, r.encoding_format)}
            for i, v in enumerate(result.data)
        ]
        usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
        if record is not None:
            record.prompt_tokens, record.generated_tokens = result.prompt_tokens, 0
        return json_response({"object": "list", "data": data, "model": r.model or handle.name, "usage": usage})

    admin.register(app, supervisor)
    dashboard.register(app)
    metrics.register(app, supervisor)
    native.register(app, resolve)  # None: the default model

    return app


def _error_response(rendered: tuple[bytes, int, dict[str, str]]) -> Response:
    body, status, headers = rendered
    return Response(body, status=status, headers=headers)


def _encode_vector(v: list[float], fmt: str) -> list[float] | str:
    if fmt == "base64":
        # OpenAI's base64 format is little-endian float32.
        return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()
    return v


async def _generate(handle: ModelHandle, job: GenerationJob) -> Response:
    """Run one job; the Generation is closed when its answer is done, however it ends."""
    gen = await Generation.start(handle, job)
    fmt = Completion(model=job.model, chat=job.chat)
    if not job.stream:
        try:
            body = await whole(gen, fmt, job)
        finally:
            gen.close()
        return Response(body, content_type="application/json")
    stream = sse.Body(events(gen, fmt, job), gen.close)
    return Response(stream, status=200, headers=sse.HEADERS)
