"""Ollama's routes: /api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/embed,
/api/embeddings and /api/version, so that Ollama's clients (its Python and JavaScript
libraries, Open WebUI, editors' plugins) work against Corral unchanged.

Models are Corral's configured ones, listed with a tag (`name:latest`) and found with or
without it. A chat or generate with no messages (or an empty prompt) loads the model, or
unloads it with `keep_alive: 0`, as Ollama's do. Ollama's `pull`, `create`, `copy`,
`delete` and `push` are not served: Corral's models are its config's.

With keys configured, a model's lifetime is the operator's (router/server/steering.py):
the unload form is an admin key's (403 naming keep_alive), and an API key's keep_alive is
held between the model's idle_timeout and `[server] max_keep_alive`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from functools import partial
from typing import Callable

import msgspec
from quart import Blueprint, Response


from router.api.answering import answer, embed, job_for
from router.api.dialect import Server
from router.api.ollama import models
from router.api.ollama.render import HEADERS, Reply, lines, whole
from router.api.ollama.schemas import (
    OllamaChatRequest, OllamaEmbeddingsRequest, OllamaEmbedRequest, OllamaGenerateRequest, OllamaShowRequest,
)
from router.api.ollama.translate import PARAM_NAMES, chat_job, generate_job, keep_alive
from router.generation.job import GenerationJob, KeepAlive
from router.generation.prompts import MAX_PROMPTS
from router.server import access_log, auth, bodies, steering
from router.server.json_body import decode
from router.generation.remote.embed import embed as remote_embed
from router.upstream import remote
from router.upstream.remote import RemoteModel
from router.upstream.routing import translation
from supervisor.errors import InvalidRequest, ModelNotFound, Unsupported
from supervisor.group import Served
from supervisor.model_loop import idle_limit
from worker.protocol import SamplingParams

# The Ollama release whose API this follows (docs/api.md); clients compare it.
VERSION = "0.6.4"
_json = msgspec.json.Encoder()


def owns(path: str) -> bool:
    return path.startswith("/api/")


def _json_response(obj: object) -> Response:
    return Response(_json.encode(obj), content_type="application/json; charset=utf-8")


def register(app: Blueprint, server: Server) -> None:
    def resolve(name: str | None, generating: bool = True) -> Served:
        """A model by its name, with or without Ollama's `:latest` tag; a 404 names the
        model as the client did."""
        if not name:
            raise InvalidRequest("model is required", "model")
        try:
            handle = server.resolve(name)
        except ModelNotFound:
            if models.untagged(name) == name:
                raise
            try:
                handle = server.resolve(models.untagged(name))
            except ModelNotFound:
                raise ModelNotFound(f"The model `{name}` does not exist.", "model") from None
        if generating and handle.spec.embeddings:
            raise Unsupported(f'"{name}" does not support generate (it serves embeddings only).', "model")
        return handle

    async def generation(
        name: str, chat: bool, empty: bool, kept: KeepAlive, job_of: Callable[[SamplingParams], GenerationJob]
    ) -> Response:
        """/api/chat's or /api/generate's answer; `empty`: the request has nothing to answer
        (no messages, or no prompt), which loads the model, or with keep_alive 0 unloads it.
        `job_of` builds the job from the model's generation defaults."""
        reply = Reply(model=name, chat=chat, record=access_log.current())
        refuse_unload(kept, empty)
        elsewhere = remote.current()
        if elsewhere is not None:  # served elsewhere: nothing here to load, unload or keep
            job = job_for(elsewhere, job_of, PARAM_NAMES)
            if empty:
                return done(reply, "unload" if kept.seconds == 0 else "load")
            return await answer(
                elsewhere, job, partial(whole, reply=reply), partial(lines, reply=reply), stream_headers=HEADERS,
                content_type="application/json; charset=utf-8",
            )
        if empty and kept.seconds == 0:
            # Ollama unloads before it asks what the model can do: `ollama stop` works on
            # an embedding model too.
            return done(reply, await load_or_unload(resolve(name, generating=False), kept))
        handle = resolve(name)
        kept = bounded(handle, kept)
        job = dataclasses.replace(job_of(handle.spec.defaults), keep_alive=kept)  # the body's 400s, before any load
        if empty:
            return done(reply, await load_or_unload(handle, kept))
        return await answer(
            handle, job, partial(whole, reply=reply), partial(lines, reply=reply), stream_headers=HEADERS,
            content_type="application/json; charset=utf-8",
        )

    def done(reply: Reply, reason: str) -> Response:
        obj = reply.part()
        obj.update(done=True, done_reason=reason)
        return _json_response(obj)

    async def load_or_unload(handle: Served, kept: KeepAlive) -> str:
        """Nothing to answer: Ollama's way to load a model, or with keep_alive 0 to unload
        it (once what is in flight is done). Returns the done_reason."""
        if kept.seconds == 0:
            handle.request_unload(reason="unloaded by a keep_alive of 0")
            return "unload"
        await hold(handle, kept)
        return "load"

    def refuse_unload(kept: KeepAlive, empty: bool) -> None:
        """A request with nothing to answer and keep_alive 0 unloads the model: with keys
        configured, an admin key's alone (403 naming keep_alive)."""
        if empty and kept.seconds == 0:
            steering.refuse_unless_steering(
                server.supervisor.config.keys, auth.current_key(),
                "Unloading a model (keep_alive 0 with nothing to answer)", "keep_alive",
            )

    def bounded(handle: Served, kept: KeepAlive) -> KeepAlive:
        """`kept` as the request's key may set it: an admin key's (or any, with no key
        configured) as it came; an API key's held between the model's idle_timeout and
        [server] max_keep_alive, so that it neither unloads the model early nor pins it."""
        config = server.supervisor.config
        if steering.may_steer(config.keys, auth.current_key()):
            return kept
        seconds = steering.bounded_keep_alive(kept.seconds, handle.spec.idle_timeout, config.server.max_keep_alive)
        return KeepAlive(seconds)

    async def hold(handle: Served, kept: KeepAlive) -> None:
        """Load the model if it is not loaded, and set its keep_alive while holding it."""
        async with handle.lease():
            handle.set_keep_alive(kept.seconds)

    @app.post("/api/chat")
    async def chat() -> Response:
        r: OllamaChatRequest = decode(await bodies.read_body(), OllamaChatRequest, api="Ollama")
        kept = keep_alive(r.keep_alive)
        return await generation(r.model, True, not r.messages, kept, partial(chat_job, r, r.model))

    @app.post("/api/generate")
    async def generate() -> Response:
        r: OllamaGenerateRequest = decode(await bodies.read_body(), OllamaGenerateRequest, api="Ollama")
        kept = keep_alive(r.keep_alive)
        return await generation(r.model, False, not r.prompt, kept, partial(generate_job, r, r.model))

    @app.route("/api/tags", methods=["GET", "HEAD"])
    async def tags() -> Response:
        visible = [h for h in server.supervisor.handles.values() if auth.visible(h)]
        key = auth.current_key()
        # Models served elsewhere that take Ollama's chats: as they come, or translated to
        # OpenAI's or Anthropic's API (router/upstream/routing.py).
        served_elsewhere = [
            models.remote_tag_entry(name, up.model, server.started)
            for up in server.supervisor.config.upstreams.values()
            if not up.local and ("ollama" in up.dialects or translation(up.dialects, "/api/chat") is not None)
            and (key is None or key.may_use(up.name))
            for name in (up.name, *up.aliases)
        ]
        adapter_models = [
            e for view, h in auth.adapter_models(server.supervisor) for e in models.tag_entries(h, (view.name, *view.aliases))
        ]
        return _json_response({"models": [e for h in visible for e in models.tag_entries(h)] + adapter_models + served_elsewhere})

    @app.post("/api/show")
    async def show() -> Response:
        r: OllamaShowRequest = decode(await bodies.read_body(), OllamaShowRequest, api="Ollama")
        handle = resolve(r.model or r.name, generating=False)
        return _json_response(models.show(handle, bool(r.verbose)))

    @app.get("/api/ps")
    async def ps() -> Response:
        now = time.time()
        out = []
        for h in server.supervisor.handles.values():
            if not auth.visible(h):
                continue
            limit = idle_limit(h.spec, h.keep_alive)
            # Idle from its last request's end; busy now, idle from now at the earliest.
            since = h.last_used_wall if h.in_flight == 0 and h.last_used_wall is not None else now
            entry = models.ps_entry(h, None if limit is None else since + limit)
            if entry is not None:
                out.append(entry)
        return _json_response({"models": out})

    @app.route("/api/version", methods=["GET", "HEAD"])
    async def version() -> Response:
        return _json_response({"version": VERSION})

    @app.post("/api/embed")
    async def embed_route() -> Response:
        started = time.monotonic()
        r: OllamaEmbedRequest = decode(await bodies.read_body(), OllamaEmbedRequest, api="Ollama")
        handle = embedding_model(r.model)
        texts = [r.input] if isinstance(r.input, str) else list(r.input or [])
        if len(texts) > MAX_PROMPTS:
            raise InvalidRequest(f"Invalid value for 'input': at most {MAX_PROMPTS} entries are allowed.", "input")
        if any(not t for t in texts):
            raise InvalidRequest("'input' must not hold an empty string.", "input")
        if r.dimensions is not None and r.dimensions < 1:
            raise InvalidRequest("Invalid 'dimensions': expected a value >= 1.", "dimensions")
        kept = keep_alive(r.keep_alive)
        refuse_unload(kept, not texts)
        vectors: list[list[float]] = []
        prompt_tokens = 0
        if isinstance(handle, RemoteModel):  # served elsewhere: nothing here to load or keep
            if texts:
                got = await remote_embed(handle, texts)
                # L2-normalised, as Ollama's and a local model's are: an OpenAI-compatible
                # upstream's may not be (llama-server's are unless --embd-normalize says not).
                vectors, prompt_tokens = [_normalized(v) for v in got.data], got.prompt_tokens
        elif not texts:  # an empty request loads the model, as Ollama's (or unloads it)
            await load_or_unload(handle, bounded(handle, kept))
        else:
            # Ollama cuts an input too long for the model at its end unless told not to.
            result = await embed(handle, texts, truncate=r.truncate is not False)
            handle.set_keep_alive(bounded(handle, kept).seconds)
            vectors, prompt_tokens = result.data, result.prompt_tokens
        if r.dimensions is not None:
            vectors = [_normalized(v[: r.dimensions]) for v in vectors]
        record = access_log.current()
        return _json_response({
            "model": r.model, "embeddings": vectors,
            "total_duration": int((time.monotonic() - started) * 1e9),
            "load_duration": int(((record.load_wait if record is not None else None) or 0.0) * 1e9),
            "prompt_eval_count": prompt_tokens,
        })

    @app.post("/api/embeddings")
    async def embeddings() -> Response:
        r: OllamaEmbeddingsRequest = decode(await bodies.read_body(), OllamaEmbeddingsRequest, api="Ollama")
        handle = embedding_model(r.model)
        kept = keep_alive(r.keep_alive)  # a bad one is a 400 before any work
        refuse_unload(kept, not r.prompt)  # held with keep_alive 0, it would unload at once
        if isinstance(handle, RemoteModel):
            vector = (await remote_embed(handle, [r.prompt])).data[0] if r.prompt else []
            return _json_response({"embedding": _normalized(vector)})  # as a local model's
        kept = bounded(handle, kept)
        if not r.prompt:
            await hold(handle, kept)
            return _json_response({"embedding": []})
        result = await embed(handle, [r.prompt])
        handle.set_keep_alive(kept.seconds)
        return _json_response({"embedding": result.data[0]})

    def embedding_model(name: str) -> Served | RemoteModel:
        """The model to embed with: a local one that serves embeddings, or one served
        elsewhere that the request reaches translated (router/generation/remote/embed.py)."""
        elsewhere = remote.current()
        if elsewhere is not None:
            return elsewhere
        handle = resolve(name, generating=False)
        if not handle.spec.embeddings:
            raise Unsupported(
                f'"{name}" does not support embeddings (set embeddings = true in its config).', "model"
            )
        return handle



def _normalized(v: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v] if norm > 0 else v
