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
from typing import AsyncIterator

import msgspec
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from router import admin, bodies, connections, metrics, schemas
from router.errors import http_status, render, sse_event
from router.openai_format import DONE, Completion
from supervisor.config import Config
from supervisor.connection import RequestStream
from supervisor.errors import CorralError, InternalError, Unsupported
from supervisor.lease import Lease
from supervisor.supervisor import Supervisor
from worker.protocol import ChatMessage, SamplingParams, TokenEvent

log = logging.getLogger("corral.router")
_json = msgspec.json.Encoder()

SSE_HEADERS = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",  # nginx: pass events through as they come
}


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

    def json_response(obj: object, status: int = 200) -> Response:
        return Response(_json.encode(obj), status=status, content_type="application/json")

    @app.errorhandler(CorralError)
    async def on_corral_error(exc: CorralError) -> Response:
        body, status, headers = render(exc)
        return Response(body, status=status, headers=headers)

    @app.errorhandler(HTTPException)
    async def on_http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        if status == 404:
            msg, code = f"Unknown request URL: {request.method} {request.path}", "unknown_url"
        elif status == 405:
            msg, code = f"Method {request.method} is not allowed on {request.path}", "method_not_allowed"
        elif status == 413:
            msg = f"The request body exceeds {config.server.max_body_bytes} bytes"
            code = "request_too_large"
        else:
            msg, code = exc.description or exc.name, None
        body, status, headers = http_status(status, msg, code)
        return Response(body, status=status, headers=headers)

    @app.errorhandler(Exception)
    async def on_unexpected(exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        body, status, headers = render(InternalError(f"internal error: {type(exc).__name__}"))
        return Response(body, status=status, headers=headers)

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok"})

    @app.get("/v1/models")
    async def list_models() -> Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": started,
                "owned_by": "corral",
                "aliases": list(h.spec.aliases),
                "state": h.state.value,
            }
            for name, h in supervisor.handles.items()
        ]
        return json_response({"object": "list", "data": data})

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Response:
        r: schemas.ChatRequest = schemas.decode(await bodies.read_body(), schemas.ChatRequest)
        handle = supervisor.resolve(r.model)
        _needs_generation(handle.spec.embeddings, r.model)
        max_tokens = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
        params = schemas.sampling_params(r, max_tokens)
        messages = schemas.chat_messages(r)
        lease = await handle.acquire()
        return await _generate(lease, r.model, True, params, r, messages=messages)

    @app.post("/v1/completions")
    async def completions() -> Response:
        r: schemas.CompletionRequest = schemas.decode(await bodies.read_body(), schemas.CompletionRequest)
        handle = supervisor.resolve(r.model)
        _needs_generation(handle.spec.embeddings, r.model)
        params = schemas.sampling_params(r, r.max_tokens if r.max_tokens is not None else 16)
        prompt = schemas.completion_prompt(r)
        lease = await handle.acquire()
        return await _generate(lease, r.model, False, params, r, prompt=prompt)

    @app.post("/v1/embeddings")
    async def embeddings() -> Response:
        r: schemas.EmbeddingRequest = schemas.decode(await bodies.read_body(), schemas.EmbeddingRequest)
        handle = supervisor.resolve(r.model)
        if not handle.spec.embeddings:
            raise Unsupported(
                f"The model `{r.model}` does not serve embeddings (set embeddings = true).", "model"
            )
        inputs = schemas.embedding_inputs(r)
        async with handle.lease() as conn:
            result = await conn.embed(inputs)
        data = [
            {"object": "embedding", "index": i, "embedding": _encode_vector(v, r.encoding_format)}
            for i, v in enumerate(result.data)
        ]
        usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
        return json_response({"object": "list", "data": data, "model": r.model, "usage": usage})

    admin.register(app, supervisor)
    metrics.register(app, supervisor)

    @app.post("/tokenize")
    async def tokenize() -> Response:
        r: schemas.TokenizeRequest = schemas.decode(await bodies.read_body(), schemas.TokenizeRequest)
        handle = supervisor.resolve(r.model)
        async with handle.lease() as conn:
            if (ready := conn.ready) is not None:
                schemas.refuse_if_too_long(
                    ready,
                    r.content,
                    ready.n_ctx_slot,
                    "the text",
                    f"/tokenize takes at most {ready.n_ctx_slot} tokens with this model (its context)",
                    "content",
                )
            tokens = await conn.tokenize(r.content, add_special=r.add_special)
        return json_response({"tokens": tokens})

    return app


def _needs_generation(is_embedding_model: bool, model: str) -> None:
    if is_embedding_model:
        raise Unsupported(
            f"The model `{model}` serves embeddings only; use /v1/embeddings.", "model"
        )


def _encode_vector(v: list[float], fmt: str) -> list[float] | str:
    if fmt == "base64":
        # OpenAI's base64 format is little-endian float32.
        return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()
    return v


async def _generate(
    lease: Lease,
    model: str,
    chat: bool,
    params: SamplingParams,
    r: schemas._Sampling,
    prompt: str | None = None,
    messages: list[ChatMessage] | None = None,
) -> Response:
    """Run one generation on a held lease; the lease is released when the answer is done."""
    stream: RequestStream | None = None
    try:
        ready = lease.conn.ready
        if ready is not None:
            schemas.refuse_if_too_long(
                ready,
                schemas.bounded_text(prompt, messages),
                ready.n_ctx_slot - 1,
                "the prompt",
                f"this model's context holds {ready.n_ctx_slot} tokens, prompt and output together",
                "messages" if messages is not None else "prompt",
            )
        stream = lease.conn.generate(params, prompt=prompt, messages=messages)
        # Wait for the first answer before committing to a status: errors such as
        # context_length_exceeded arrive here and become a proper 4xx.
        first = await stream.receive()
        assert isinstance(first, TokenEvent)
    except BaseException:
        if stream is not None:
            stream.close()
        lease.release()
        raise
    fmt = Completion(model=model, chat=chat)
    if not r.stream:
        try:
            parts, ev = [first.text], first
            while ev.finish_reason is None:
                ev = await _next(stream)
                parts.append(ev.text)
        finally:
            stream.close()
            lease.release()
        return Response(
            fmt.whole("".join(parts), ev.finish_reason, ev.usage),
            content_type="application/json",
        )
    include_usage = bool(r.stream_options and r.stream_options.include_usage)
    body = _SSEBody(_sse(stream, lease, fmt, first, include_usage), stream, lease)
    return Response(body, status=200, headers=SSE_HEADERS)


class _SSEBody:
    """The SSE body iterator, with cleanup that does not depend on iteration.

    An async generator that never started never runs its `finally`: a client that vanishes
    between the headers and the first chunk would leak the lease (the model could never
    unload) and leave the worker generating. Quart calls `aclose()` on a body iterator
    whether or not it was iterated, so cleanup lives there too; both calls are idempotent.
    """

    def __init__(self, gen: AsyncIterator[bytes], stream: RequestStream, lease: Lease) -> None:
        self._gen, self._stream, self._lease = gen, stream, lease

    def __aiter__(self) -> _SSEBody:
        return self

    async def __anext__(self) -> bytes:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        try:
            await self._gen.aclose()  # type: ignore[attr-defined]
        finally:
            self._stream.close()
            self._lease.release()


async def _next(stream: RequestStream) -> TokenEvent:
    ev = await stream.receive()
    assert isinstance(ev, TokenEvent)
    return ev


async def _sse(
    stream: RequestStream, lease: Lease, fmt: Completion, first: TokenEvent, include_usage: bool
) -> AsyncIterator[bytes]:
    """The SSE body. A client that disconnects cancels this generator; `finally` then
    cancels the generation in the worker and releases the lease."""
    try:
        if fmt.chat:
            yield fmt.chunk("", first=True)
        ev = first
        while True:
            if ev.text:
                yield fmt.chunk(ev.text)
            if ev.finish_reason is not None:
                break
            ev = await _next(stream)
        yield fmt.chunk(None, ev.finish_reason)
        if include_usage:
            yield fmt.usage_chunk(ev.usage)
        yield DONE
    except CorralError as exc:
        yield sse_event(exc)
    finally:
        stream.close()
        lease.release()
