"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens, so that
Anthropic's SDKs and Claude Code work against Corral unchanged (ANTHROPIC_BASE_URL).

Keys come as `x-api-key` or `Authorization: Bearer` (router/server/auth.py); the
`anthropic-version` and `anthropic-beta` headers are accepted whatever they say, as the
fields they turn on are (router/api/anthropic/schemas.py). Each answer carries Anthropic's
`request-id` header, the access log's id, beside `x-request-id`.
"""

from __future__ import annotations

from functools import partial

import msgspec
from quart import Blueprint, Response

from router.api.anthropic import schemas
from router.api.anthropic.render import Reply, stream, whole
from router.api import hosted_tools
from router.api.anthropic.translate import PARAM_NAMES, chat_messages, messages_job, served_tools, thinking_kwargs, tools
from router.api.answering import answer, job_for, prompt_tokens
from router.api.dialect import Server
from router.generation.job import GenerationJob
from router.server import access_log, bodies
from router.server.json_body import decode
from worker.protocol import SamplingParams

_json = msgspec.json.Encoder()
_HINT = " (Anthropic's Messages API generates text)"


def owns(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def _with_request_id(response: Response) -> Response:
    record = access_log.current()
    if record is not None:
        response.headers["request-id"] = record.id
    return response


def register(app: Blueprint, server: Server) -> None:
    @app.post("/v1/messages")
    async def messages() -> Response:
        r: schemas.MessagesRequest = decode(await bodies.read_body(), schemas.MessagesRequest, api="Anthropic")
        target = server.target(r.model, _HINT)
        r.tools, skipped = hosted_tools.served(server.supervisor.config.server.hosted_tools, r.tools, served_tools)
        job = job_for(target, partial(messages_job, r, r.model or target.name), PARAM_NAMES)
        reply = Reply(model=job.model, stop_sequences=tuple(r.stop_sequences or ()))
        response = await answer(target, job, partial(whole, reply=reply), partial(stream, reply=reply))
        return _with_request_id(hosted_tools.note("Anthropic", skipped, response))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens() -> Response:
        """The prompt's tokens, as /v1/messages would render and tokenize it. Generates
        nothing (the model loads, as its tokenizer is the model's)."""
        r: schemas.CountTokensRequest = decode(await bodies.read_body(), schemas.CountTokensRequest, api="Anthropic")
        target = server.target(r.model, _HINT)
        r.tools, skipped = hosted_tools.served(server.supervisor.config.server.hosted_tools, r.tools, served_tools)
        job = GenerationJob(
            model=r.model or target.name, params=SamplingParams(), messages=tuple(chat_messages(r.system, r.messages)),
            tools=tools(r.tools, r.tool_choice), template_kwargs=thinking_kwargs(r.thinking),
        )
        n = await prompt_tokens(target, job)
        response = Response(_json.encode({"input_tokens": n}), content_type="application/json")
        return _with_request_id(hosted_tools.note("Anthropic", skipped, response))
