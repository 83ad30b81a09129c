"""llama-server's own routes, so that its clients work against Corral: /completion,
/tokenize, /detokenize, /apply-template, GET /props and GET /slots.

Each takes `model` (in the body, or `?model=` on the GETs) to pick the model, as
llama-server's router mode does. Errors on these routes are in llama-server's shape
(router/api/llama/errors.py). /apply-template takes OpenAI's chat messages and tools, as
llama-server's does, and reads them with the OpenAI dialect's decoders.
"""

from __future__ import annotations

from functools import partial
from typing import AsyncIterator, Awaitable, Callable

from quart import Blueprint, Response, request


from router.api.answering import answer, embed, job_for, started
from router.api.llama import embedding, rerank
from router.api.dialect import Server
from router.api.llama.errors import error_event
from router.api.llama.render import NativeCompletion, encode, props_json, router_props_json, slots_json
from router.api.llama.schemas import (
    ApplyTemplateRequest,
    DetokenizeRequest,
    InfillRequest,
    ModelActionRequest,
    NativeEmbeddingRequest,
    RerankRequest,
    NativeCompletionRequest,
    TokenizeRequest,
)
from router.api.llama.translate import completion_job, infill_job
from router.api.openai import fields as request_fields
from router.api.openai import schemas
from router.generation import owners, tool_schemas
from router.generation.answer import gather
from router.generation.job import GenerationJob
from router.generation.events import Event, Failed, Finish, TextDelta
from router.generation.prompt_bound import refuse_if_too_long
from router.generation.prompts import Prompt
from router.server import access_log, auth, bodies, sse, steering
from router.server.json_body import decode
from router.upstream import remote
from router.upstream.remote import RemoteModel
from supervisor.config import Config
from supervisor.connection import WorkerConnection
from supervisor.errors import InternalError, InvalidRequest, NotServed, Unsupported, WorkerUnavailable
from supervisor.group import Served
from supervisor.lifecycle import State
from worker.protocol import Ready

# A prompt's text for an answer's `prompt` field.
TextOf = Callable[[Prompt], Awaitable[str]]
# The paths whose errors are in llama-server's shape.
PATHS = frozenset({
    "/completion", "/completions", "/tokenize", "/detokenize", "/apply-template", "/props", "/slots",
    "/models/load", "/models/unload", "/rerank", "/reranking", "/v1/rerank", "/v1/reranking",
    "/embedding", "/embeddings", "/infill",
})


def owns(path: str) -> bool:
    return path in PATHS


def _json(obj: object) -> Response:
    return Response(encode(obj), status=200, content_type="application/json")


def register(app: Blueprint, server: Server) -> None:
    """Add the routes."""
    resolve = server.resolve

    def generating_model(model: str | None) -> Served:
        handle = resolve(model)
        if handle.spec.embeddings:
            raise Unsupported(f"The model `{handle.name}` serves embeddings only.", "model")
        return handle

    @app.post("/completion")
    @app.post("/completions")  # llama-server's, as /completion: OpenAI's is /v1/completions
    async def completion() -> Response:
        r: NativeCompletionRequest = decode(await bodies.read_body(), NativeCompletionRequest)
        elsewhere = remote.current()
        if elsewhere is not None:  # served elsewhere: a text completion there, translated
            return await _respond_remote(elsewhere, r)
        handle = generating_model(r.model)
        name = r.model if r.model is not None else handle.name
        job = completion_job(r, name, handle.spec.defaults)
        prompts: list[Prompt] = (
            list(job.prompt_list) if job.prompt_list is not None
            else [job.prompt if job.prompt is not None else tuple(job.prompt_parts or ())]
        )
        return await _respond(handle, job, r, prompts)

    @app.post("/infill")
    async def infill() -> Response:
        """llama-server's fill-in-the-middle completion, answered as /completion is; 501
        for a model without the fill-in-the-middle tokens, as llama-server answers."""
        r: InfillRequest = decode(await bodies.read_body(), InfillRequest)
        handle = generating_model(r.model)
        async with handle.lease() as conn:
            missing = conn.ready.fim_missing if conn.ready is not None else ""
        if missing:
            raise NotServed(f"Infill is not supported by this model: {missing}", "model")
        name = r.model if r.model is not None else handle.name
        job = infill_job(r, name, handle.spec.defaults)
        return await _respond(handle, job, r, [r.prompt if isinstance(r.prompt, str) else ""])

    @app.post("/tokenize")
    async def tokenize() -> Response:
        r: TokenizeRequest = decode(await bodies.read_body(), TokenizeRequest)
        handle = resolve(r.model)
        async with handle.lease() as conn:
            if (ready := conn.ready) is not None:
                refuse_if_too_long(
                    ready,
                    r.content,
                    ready.n_ctx_slot,
                    "the text",
                    f"/tokenize takes at most {ready.n_ctx_slot} tokens with this model (its context)",
                    "content",
                )
            result = await conn.tokenize_pieces(r.content, r.add_special, r.parse_special, r.with_pieces)
        if not r.with_pieces:
            return _json({"tokens": result.tokens})
        pieces = result.pieces or []
        if len(pieces) != len(result.tokens):
            raise InternalError("the worker answered /tokenize without a piece for every token")
        return _json({"tokens": [{"id": t, "piece": p} for t, p in zip(result.tokens, pieces)]})

    @app.post("/detokenize")
    async def detokenize() -> Response:
        r: DetokenizeRequest = decode(await bodies.read_body(), DetokenizeRequest)
        handle = resolve(r.model)
        async with handle.lease() as conn:
            content = await conn.detokenize(list(r.tokens))
        return _json({"content": content})

    @app.post("/apply-template")
    async def apply_template() -> Response:
        r: ApplyTemplateRequest = decode(await bodies.read_body(), ApplyTemplateRequest)
        handle = resolve(r.model)
        # The same checks and normalisation as a chat request's messages, tools and
        # template variables: the prompt is the one that request would get.
        messages = request_fields.chat_messages(schemas.ChatRequest(model=handle.name, messages=r.messages))
        tools = tool_schemas.tool_request(r.tools, r.tool_choice, r.parallel_tool_calls).offered
        kwargs = request_fields.chat_template_kwargs(r.chat_template_kwargs)
        async with handle.lease() as conn:
            prompt = await conn.render(messages, list(tools) if tools else None, kwargs, r.add_generation_prompt)
        return _json({"prompt": prompt})

    @app.post("/rerank")
    @app.post("/reranking")
    @app.post("/v1/rerank")
    @app.post("/v1/reranking")
    async def rerank_documents() -> Response:
        """Score documents against a query with a reranker (a model with pooling = "rank"),
        in the slot line as embeddings are; answered as llama-server answers."""
        r: RerankRequest = decode(await bodies.read_body(), RerankRequest)
        handle = resolve(r.model)
        if not handle.spec.embeddings or handle.spec.pooling != "rank":
            raise Unsupported(f'The model `{handle.name}` is not a reranker (pooling = "rank" in its config).', "model")
        rr = rerank.read(r)
        result = await embed(handle, rr.documents, rank_query=rr.query)
        return _json(rerank.answer(rr, result.data, result.prompt_tokens, r.model or handle.name))

    @app.post("/embedding")
    @app.post("/embeddings")
    async def native_embeddings() -> Response:
        """llama-server's native embeddings (router/api/llama/embedding.py); a model with
        pooling = "none" answers a vector per token here, and only here."""
        r: NativeEmbeddingRequest = decode(await bodies.read_body(), NativeEmbeddingRequest)
        handle = resolve(r.model)
        if not handle.spec.embeddings:
            raise NotServed(
                "This server does not support embeddings. Start it with `--embeddings`"
                f" (for Corral: embeddings = true in the config of `{handle.name}`).",
                "model",
            )
        prompts, _ = embedding.inputs(r)
        result = await embed(handle, prompts, normalize=r.embd_normalize, native=True)
        record = access_log.current()
        if record is not None:
            record.prompt_tokens, record.generated_tokens = result.prompt_tokens, 0
        return _json(embedding.answer(result))

    @app.post("/models/load")
    async def models_load() -> Response:
        """llama-server's router mode: load a model. Answers once it is loaded (llama-server
        answers at once and its client polls GET /models for `loaded`: a client that polls
        finds it so). Already running: 400, as llama-server answers."""
        r: ModelActionRequest = decode(await bodies.read_body(), ModelActionRequest)
        handle = server.find(r.model)
        if handle.state in (State.STARTING, State.READY):
            raise InvalidRequest("model is already running", "model")
        await handle.ensure_ready()
        return _json({"success": True})

    @app.post("/models/unload")
    async def models_unload() -> Response:
        """llama-server's router mode: unload a model once what it has in flight is done.
        Not running: 400, as llama-server answers. With keys configured, an admin key's
        alone: the next request of every other key would pay the load
        (router/server/steering.py)."""
        steering.refuse_unless_steering(server.supervisor.config.keys, auth.current_key(), "POST /models/unload")
        r: ModelActionRequest = decode(await bodies.read_body(), ModelActionRequest)
        handle = server.find(r.model)
        if handle.state not in (State.STARTING, State.READY, State.DRAINING):
            raise InvalidRequest("model is not running", "model")
        handle.request_unload(reason="unloaded by POST /models/unload")
        return _json({"success": True})

    @app.get("/props")
    async def props() -> Response:
        """One model's properties. Loads the model if it is not loaded: they are what its
        worker found in the GGUF. An asleep model (stopped by its idle_timeout) answers from
        its last load with `is_sleeping`, and stays asleep, as llama-server's does. Without
        `model` in router mode (no model is the default, or the models come from a
        `models_dir`, as llama-server's --models-dir), the router's own, as its router mode
        answers."""
        model = request.args.get("model")
        if model is None and _router_mode(server.supervisor.config):
            return _json(router_props_json(server.supervisor.config))
        handle = server.find(model)
        ready: Ready | None = handle.last_ready
        if handle.sleeping and ready is not None and handle.state is State.STOPPED:
            sleeping = True
        else:
            handle = resolve(model)  # the autoload rule, now that it would load
            async with handle.lease() as conn:
                ready, sleeping = conn.ready, False
        if ready is None:
            raise InternalError("the worker is ready but sent no Ready frame")
        out = props_json(handle.spec.path.name, model or handle.name, ready, ready.slots, handle.spec.defaults)
        return _json({**out, "is_sleeping": sleeping})

    @app.get("/slots")
    async def slots() -> Response:
        """What each of one model's slots is doing. With `fail_on_no_slot=1`, 503 when
        every slot is busy (llama-server's readiness probe). 501 when the config turns it
        off, as llama-server's --no-slots. A busy slot running another key's request shows
        that it is busy and nothing of the request (router/server/steering.py)."""
        if not server.supervisor.config.server.slots_endpoint:
            raise NotServed("This server does not serve the slots endpoint: set [server] slots_endpoint = true.")
        handle = resolve(request.args.get("model"))
        async with handle.lease() as conn:
            states = await conn.slots()
        if request.args.get("fail_on_no_slot", "") not in ("", "0", "false") and all(s.is_processing for s in states):
            raise WorkerUnavailable("no slot available", retry=True, retry_after=1.0)
        ring, viewer = server.supervisor.config.keys, auth.current_key()
        private = frozenset(
            s.id for s in states
            if s.is_processing and not steering.shows_request(ring, viewer, owners.owner_of(conn, s.id_task))
        )
        return _json(slots_json(states, private))


async def _prompt_text(conn: WorkerConnection, prompt: Prompt) -> str:
    """The prompt as text for the answer's `prompt`: token ids written out as the worker
    reads them (llama-server shows the processed prompt)."""
    if isinstance(prompt, str):
        return prompt
    out: list[str] = []
    run: list[int] = []
    for p in [*prompt, ""]:  # the trailing "" flushes the last run of ids
        if isinstance(p, int):
            run.append(p)
            continue
        if run:
            out.append(await conn.detokenize(run))
            run = []
        out.append(p)
    return "".join(out)


def _router_mode(config: Config) -> bool:
    """Whether Corral stands where llama-server's router mode does: models from a folder
    with none named the default, or several models and no default."""
    server = config.server
    if server.default_model is not None:
        return False
    return server.models_dir is not None or len(config.models) != 1


async def _respond(
    handle: Served, job: GenerationJob, r: NativeCompletionRequest, prompts: list[Prompt]
) -> Response:
    """Run `job` and answer as llama-server's /completion does, whole or streamed."""
    gen, events = await started(handle, job)
    ready = gen.conn.ready
    fmt = NativeCompletion(
        model=job.model,
        params=gen.params,  # as capped (max_tokens_limit, a key's max_tokens), as llama-server shows n_predict
        n_ctx=ready.n_ctx_slot if ready is not None else 0,
        stream=r.stream,
        return_tokens=r.return_tokens,
        response_fields=r.response_fields,
    )
    text_of = partial(_prompt_text, gen.conn)
    if not r.stream:
        try:
            body = await _whole(events, text_of, fmt, prompts)
        finally:
            gen.close()
        return Response(body, content_type="application/json")
    return Response(sse.Body(_events(events, text_of, fmt, prompts), gen.close), status=200, headers=sse.HEADERS)


async def _respond_remote(target: RemoteModel, r: NativeCompletionRequest) -> Response:
    """/completion for a model served by an OpenAI-compatible upstream: its text prompt
    as a text completion there (outbound.py refuses token prompts, naming `prompt`),
    answered in llama-server's shape. The slot's context is not known here (n_ctx 0)."""
    if r.return_tokens:
        raise Unsupported(
            "'return_tokens' cannot be answered for this model: its upstream's token ids are not relayed.",
            "return_tokens",
        )
    # Its errors name the parameters as llama-server's request does: n_probs for logprobs,
    # n_predict for the token limit unless max_tokens was the one sent.
    names = {"logprobs": "n_probs", "max_tokens": "max_tokens" if r.max_tokens is not None or r.n_predict is None else "n_predict"}
    job = job_for(target, partial(completion_job, r, r.model if r.model is not None else target.name), names)
    fmt = NativeCompletion(
        model=job.model, params=job.params, n_ctx=0, stream=r.stream, return_tokens=r.return_tokens,
        response_fields=r.response_fields,
    )
    prompts: list[Prompt] = [job.prompt or ""]

    async def text_of(prompt: Prompt) -> str:
        return prompt if isinstance(prompt, str) else ""

    return await answer(
        target, job, lambda evs: _whole(evs, text_of, fmt, prompts), lambda evs: _events(evs, text_of, fmt, prompts)
    )


async def _whole(events: AsyncIterator[Event], text_of: TextOf, fmt: NativeCompletion, prompts: list[Prompt]) -> bytes:
    """The answer; for several prompts, a list of answers in their order, as llama-server
    answers them."""
    answer = await gather(events)
    out = []
    for i, prompt in enumerate(prompts):
        c = answer.by_index[i]
        assert c.finish is not None
        out.append(fmt.final(c.content, c.tokens, c.finish, await text_of(prompt), index=i, logprobs=c.logprobs))
    return encode(out if len(prompts) > 1 else out[0])


async def _events(
    events: AsyncIterator[Event], text_of: TextOf, fmt: NativeCompletion, prompts: list[Prompt]
) -> AsyncIterator[bytes]:
    """llama-server's stream: an event per step with its text and `stop: false`, then one
    with `stop: true` and the whole answer's fields; each prompt's with its `index`. No
    [DONE], as llama-server; a failure after the headers is a final `{"error": ...}` event
    in its shape."""
    n: dict[int, int] = {}
    last: dict[int, TextDelta] = {}  # each answer's last step's text: it rides in its final event
    async for ev in events:
        if isinstance(ev, TextDelta):
            n[ev.choice] = n.get(ev.choice, 0) + len(ev.tokens)
            if ev.last:
                last[ev.choice] = ev
            else:
                yield fmt.event(ev, n[ev.choice])
        elif isinstance(ev, Finish):
            end = last.get(ev.choice)
            text, tokens = (end.text, list(end.tokens)) if end is not None else ("", [])
            prompt = await text_of(prompts[ev.choice])
            logprobs = end.logprobs if end is not None else ()
            yield sse.event(encode(fmt.final(text, tokens, ev, prompt, index=ev.choice, logprobs=logprobs)))
        elif isinstance(ev, Failed):
            yield error_event(ev.error)
