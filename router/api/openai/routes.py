"""OpenAI's routes: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models.

Every route also answers without its /v1 prefix, as llama-server's do: clients configured
with a bare base URL (http://host:8080) then work unchanged. Each inference route
resolves the model (404 before any load, as OpenAI answers), validates the body (400
naming the parameter), and answers through router/api/answering.py.
"""

from __future__ import annotations

import base64
import struct
from functools import partial
from typing import Any, AsyncIterator

import msgspec
from quart import Blueprint, Response


from router.api.answering import Target, answer, embed, job_for, prompt_tokens
from router.api.dialect import Server
from router.api.openai import fields as request_fields
from router.api.openai import schemas
from router.api.openai.render import chunks, whole
from router.api.openai.shapes import Completion
from router.api.openai.translate import chat_job, completion_job
from router.generation.events import Event
from router.generation.job import GenerationJob
from router.server import access_log, auth, bodies
from router.server.json_body import decode
from router.upstream.pool import replica_view
from supervisor.config import projector
from supervisor.config.lora_views import LoraView
from supervisor.config.schema import UpstreamSpec
from supervisor.errors import Unsupported
from supervisor.group import ModelGroup, Served
from supervisor.handle import ModelHandle
from supervisor.lifecycle import State

_json = msgspec.json.Encoder()
_json_decode = msgspec.json.Decoder(dict[str, Any]).decode


def json_response(obj: object, status: int = 200) -> Response:
    return Response(_json.encode(obj), status=status, content_type="application/json")


# llama-server's router-mode status of a model (server-models.h), by Corral's state.
_LLAMA_STATUS = {
    State.STOPPED: "unloaded",
    State.STARTING: "loading",
    State.READY: "loaded",
    State.DRAINING: "loaded",  # still serving what it has, then it restarts or unloads
    State.STOPPING: "unloaded",
    State.BACKOFF: "unloaded",
    State.FAILED: "unloaded",
}


def llama_status(state: State, sleeping: bool = False) -> dict[str, object]:
    """`status` as llama-server's GET /models gives it: the value, the arguments it was
    started with (none: a config, not a command line), and whether it failed. A model
    stopped by its idle_timeout is "sleeping" until it loads again or is unloaded, as
    llama-server's children with --sleep-idle-seconds are."""
    value = "sleeping" if sleeping and state in (State.STOPPING, State.STOPPED) else _LLAMA_STATUS[state]
    status: dict[str, object] = {"value": value, "args": []}
    if state in (State.FAILED, State.BACKOFF):
        status["failed"] = True
    return status


def register(app: Blueprint, server: Server) -> None:
    resolve = server.resolve

    def model_entry(h: Served) -> dict[str, object]:
        """OpenAI's model object, with Corral's state and llama-server's router-mode
        fields: every name it answers to, its tags, its status."""
        kinds = projector.modalities(h.spec.mmproj)
        entry: dict[str, object] = {
            "id": h.name,
            "object": "model",
            "created": server.started,
            "owned_by": "corral",
            "aliases": [h.name, *h.spec.aliases],
            "tags": list(h.spec.tags),
            "state": h.state.value,
            "status": llama_status(h.state, h.sleeping),
            # What its prompts may hold besides text, as GET /props says (its projector).
            "modalities": {m: m in kinds for m in ("vision", "audio")},
            # llama-server's router mode says it this way too (server-models.cpp, for the
            # pi coding agent; OpenRouter's model list has the same field).
            "architecture": {
                "input_modalities": ["text", *(["image"] if "vision" in kinds else []), *(["audio"] if "audio" in kinds else [])],
                "output_modalities": ["text"],
            },
        }
        if h.state in (State.FAILED, State.BACKOFF):
            entry["last_error"] = h.last_error  # why, where a client looks first
        if isinstance(h, ModelGroup):  # its workers, as `upstream.replicas` shows replicas
            entry["instances"] = [instance_view(i) for i in h.instances]
        if (up := server.supervisor.config.upstreams.get(h.name)) is not None and server.upstreams is not None:
            entry["upstream"] = {"model": up.model, "replicas": replica_view(server.upstreams, up, operator())}
        return entry

    def instance_view(h: ModelHandle) -> dict[str, object]:
        conn = h.conn
        return {
            "instance": h.name, "state": h.state.value, "in_flight": h.in_flight,
            "slots_busy": conn.active if conn is not None else 0,
        }

    def operator() -> bool:
        """Whether the request comes from the operator's side: an admin key, or a server
        that needs no key (local use)."""
        key = auth.current_key()
        return key.admin if key is not None else not server.supervisor.config.keys.api_keys_required

    def upstream_entry(up: UpstreamSpec) -> dict[str, object]:
        """A model served elsewhere only: ready while any replica is in rotation."""
        assert server.upstreams is not None
        replicas = replica_view(server.upstreams, up, operator())
        state = State.READY if any(r["healthy"] for r in replicas) else State.FAILED
        return {
            "id": up.name, "object": "model", "created": server.started, "owned_by": "corral",
            "aliases": [up.name, *up.aliases], "tags": list(up.tags), "state": state.value,
            "status": llama_status(state),
            "upstream": {"model": up.model, "replicas": replicas} if operator() else {"replicas": replicas},
        }

    def remote_only() -> list[UpstreamSpec]:
        key = auth.current_key()
        return [
            up for up in server.supervisor.config.upstreams.values()
            if not up.local and (key is None or key.may_use(up.name))
        ]

    def adapter_entry(view: LoraView, h: Served) -> dict[str, object]:
        """An adapter model: its base's state under its own names, with vLLM's `parent`
        (the base model, whose worker and memory it shares)."""
        entry = model_entry(h)
        entry.pop("instances", None)
        entry.pop("upstream", None)
        entry.update(id=view.name, aliases=[view.name, *view.aliases], tags=list(view.tags), parent=view.model)
        return entry

    @app.get("/v1/models")
    @app.get("/models")
    async def list_models() -> Response:
        data = [model_entry(h) for h in server.supervisor.handles.values() if auth.visible(h)]
        data += [adapter_entry(view, h) for view, h in auth.adapter_models(server.supervisor)]
        data += [upstream_entry(up) for up in remote_only()]
        return json_response({"object": "list", "data": data})

    @app.get("/v1/models/<path:model>")
    @app.get("/models/<path:model>")
    async def retrieve_model(model: str) -> Response:
        """The openai client's `models.retrieve`: a name or an alias, answered with the
        model it names. Loads nothing."""
        if (up := server.supervisor.config.upstream(model)) is not None and up in remote_only():
            return json_response(upstream_entry(up))
        handle = server.find(model)
        if (view := server.supervisor.config.adapter_model(model)) is not None:
            return json_response(adapter_entry(view, handle))
        return json_response(model_entry(handle))

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions() -> Response:
        r: schemas.ChatRequest = decode(await bodies.read_body(), schemas.ChatRequest)
        target = server.target(r.model)  # 404 before the body's own checks, as OpenAI does
        # A translated request's errors name the token limit the client sent.
        names = {"max_tokens": "max_completion_tokens"} if r.max_completion_tokens is not None else None
        job = job_for(target, partial(chat_job, r, r.model or target.name), names)
        if not isinstance(target, (ModelHandle, ModelGroup)):  # served elsewhere, through translation
            return await _answer(target, job)
        handle = target
        verbose = r.verbose if r.verbose is not None else server.supervisor.config.server.verbose_responses
        if verbose and not job.stream:
            async with handle.lease() as conn:
                offered = list(job.tools.offered) if job.tools.offered else None
                prompt = await conn.render(list(job.messages or ()), offered, job.template_kwargs, job.add_generation_prompt)
            return await _answer(handle, job, {"__verbose": {"prompt": prompt}})
        return await _answer(handle, job)

    @app.post("/v1/chat/completions/input_tokens")
    @app.post("/chat/completions/input_tokens")
    async def chat_input_tokens() -> Response:
        """llama-server's token count of a chat body: the tokens its prompt would be, as
        the chat route renders and tokenizes it. Generates nothing."""
        r: schemas.ChatRequest = decode(await bodies.read_body(), schemas.ChatRequest)
        target = server.target(r.model)
        n = await prompt_tokens(target, job_for(target, partial(chat_job, r, r.model or target.name)))
        return json_response({"object": "response.input_tokens", "input_tokens": n})

    @app.post("/v1/completions")  # /completions, without /v1, is llama-server's native one
    async def completions() -> Response:
        r: schemas.CompletionRequest = decode(await bodies.read_body(), schemas.CompletionRequest)
        target = server.target(r.model)
        return await _answer(target, job_for(target, partial(completion_job, r, r.model or target.name)))

    @app.post("/v1/embeddings")  # /embeddings, without /v1, is llama-server's native one
    async def embeddings() -> Response:
        r: schemas.EmbeddingRequest = decode(await bodies.read_body(), schemas.EmbeddingRequest)
        handle = resolve(r.model)
        if not handle.spec.embeddings:
            raise Unsupported(
                f"The model `{r.model or handle.name}` does not serve embeddings "
                "(set embeddings = true).",
                "model",
            )
        inputs = request_fields.embedding_inputs(r)
        record = access_log.current()
        result = await embed(handle, inputs)
        data = [
            {"object": "embedding", "index": i, "embedding": _encode_vector(v, r.encoding_format)}
            for i, v in enumerate(result.data)
        ]
        usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
        if record is not None:
            record.prompt_tokens, record.generated_tokens = result.prompt_tokens, 0
        return json_response({"object": "list", "data": data, "model": r.model or handle.name, "usage": usage})


async def _answer(target: Target, job: GenerationJob, extra: dict[str, object] | None = None) -> Response:
    """The answer; `extra`: fields added to a whole answer (llama-server's `__verbose`)."""
    fmt = Completion(model=job.model, chat=job.chat)

    async def whole_with_extra(evs: AsyncIterator[Event]) -> bytes:
        body = await whole(evs, fmt=fmt, job=job)
        return _json.encode({**_json_decode(body), **extra}) if extra else body

    return await answer(target, job, whole_with_extra, partial(chunks, fmt=fmt, job=job))


def _encode_vector(v: list[float], fmt: str) -> list[float] | str:
    if fmt == "base64":
        # OpenAI's base64 format is little-endian float32.
        return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()
    return v
