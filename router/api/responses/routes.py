"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}, and
POST /v1/responses/input_tokens, each also without /v1 as Corral's other OpenAI routes, so
that the openai SDK's `responses`, the OpenAI Agents SDK and Codex CLI work unchanged.

A response made with `store` (the default) is kept (router/api/responses/store.py) once it
is done, with its conversation, for `previous_response_id` and GET; one made with
`store: false`, or cut off by its client leaving, is not.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import msgspec
from quart import Blueprint, Response, request

from router.api.answering import answer, job_for, prompt_tokens
from router.api import hosted_tools
from router.api.dialect import Server
from router.api.openai.fields import check_metadata
from router.api.responses import items
from router.api.responses.errors import PreviousNotFound, ResponseNotFound
from router.api.responses.render import Reply, stream, whole
from router.api.responses.schemas import ResponsesRequest
from router.api.responses.store import ResponseStore
from router.api.responses.translate import PARAM_NAMES, echo, refuse_unserved, responses_job
from router.server import auth, bodies
from router.server.json_body import decode
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import ChatMessage

_json = msgspec.json.Encoder()
_PREFIXES = ("/v1/responses", "/responses")


def owns(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in _PREFIXES)


def _owner() -> str | None:
    """Who owns what this request stores: its key's identity, never its name."""
    key = auth.current_key()
    return key.owner if key is not None else None


def register(app: Blueprint, server: Server) -> None:
    store = ResponseStore()

    def limits() -> tuple[float, int]:
        cfg = server.supervisor.config.server
        return cfg.responses_ttl, cfg.responses_max_bytes

    def conversation(r: ResponsesRequest) -> tuple[ChatMessage, ...]:
        """The previous response's conversation, then this request's input."""
        history: tuple[ChatMessage, ...] = ()
        if r.previous_response_id is not None:
            prev = store.get(r.previous_response_id, _owner(), limits()[0])
            if prev is None:
                raise PreviousNotFound(
                    f"Previous response with id '{r.previous_response_id}' not found.", "previous_response_id"
                )
            history = prev.conversation
        turns = history + tuple(items.chat_messages(r.input))
        if not turns:
            raise InvalidRequest("Missing required parameter: 'input'.", "input")
        return turns

    @app.post("/v1/responses")
    @app.post("/responses")
    async def create() -> Response:
        r: ResponsesRequest = decode(await bodies.read_body(), ResponsesRequest)
        refuse_unserved(r)
        check_metadata(r.metadata)  # it is stored with the response
        target = server.target(r.model, "")
        turns = conversation(r)
        r.tools, skipped = hosted_tools.served(server.supervisor.config.server.hosted_tools, r.tools, items.served_tools)
        tools, namespaces = items.tool_request(r.tools, r.tool_choice, r.parallel_tool_calls)
        job = job_for(target, lambda defaults: responses_job(r, r.model or target.name, defaults, turns, tools), PARAM_NAMES)
        owner = _owner()

        def keep(obj: dict[str, Any], turn: ChatMessage) -> None:
            ttl, max_bytes = limits()
            store.put(obj["id"], owner, _json.encode(obj), turns + (turn,), ttl, max_bytes)

        reply = Reply(model=job.model, echo=echo(r, job.params, job.sent), keep=keep if r.store else None, namespaces=namespaces)
        response = await answer(target, job, partial(whole, reply=reply), partial(stream, reply=reply))
        return hosted_tools.note("Responses", skipped, response)

    @app.post("/v1/responses/input_tokens")
    @app.post("/responses/input_tokens")
    async def input_tokens() -> Response:
        """The tokens of the prompt a create with this body would run. Generates nothing."""
        r: ResponsesRequest = decode(await bodies.read_body(), ResponsesRequest)
        target = server.target(r.model, "")
        r.tools, skipped = hosted_tools.served(server.supervisor.config.server.hosted_tools, r.tools, items.served_tools)
        tools, _ = items.tool_request(r.tools, r.tool_choice, r.parallel_tool_calls)
        job = job_for(target, lambda defaults: responses_job(r, r.model or target.name, defaults, conversation(r), tools), PARAM_NAMES)
        n = await prompt_tokens(target, job)
        response = Response(_json.encode({"object": "response.input_tokens", "input_tokens": n}), content_type="application/json")
        return hosted_tools.note("Responses", skipped, response)

    def kept(response_id: str) -> bytes:
        item = store.get(response_id, _owner(), limits()[0])
        if item is None:
            raise ResponseNotFound(f"Response with id '{response_id}' not found.", "response_id")
        return item.response

    @app.get("/v1/responses/<response_id>")
    @app.get("/responses/<response_id>")
    async def retrieve(response_id: str) -> Response:
        if request.args.get("stream", "false").lower() == "true":
            raise Unsupported("'stream' is not supported here: a kept response is read whole.", "stream")
        return Response(kept(response_id), content_type="application/json")

    @app.delete("/v1/responses/<response_id>")
    @app.delete("/responses/<response_id>")
    async def delete(response_id: str) -> Response:
        if not store.delete(response_id, _owner(), limits()[0]):
            raise ResponseNotFound(f"Response with id '{response_id}' not found.", "response_id")
        body = {"id": response_id, "object": "response", "deleted": True}
        return Response(_json.encode(body), content_type="application/json")
