"""A Responses API body, translated into the internal generation request
(router/generation/job.py): its conversation (router/api/responses/items.py) after the
request's `instructions`, its function tools, `text.format` as a constraint (as chat's
response_format), `max_output_tokens`, `temperature`, `top_p`; `reasoning.effort` "none"
turns a reasoning template's thinking off. What the request leaves unset takes the model's
defaults.
"""

from __future__ import annotations

from typing import Any

import msgspec

from router.api.responses.schemas import ResponsesRequest
from router.generation import sampling, structured
from router.generation.job import GenerationJob
from router.generation.tool_schemas import ToolRequest
from router.generation.structured import ANY_OBJECT
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import ChatMessage, SamplingParams


# The job's fields as a Responses request names them, for the errors of one translated for
# an upstream (router/generation/remote/naming.py).
PARAM_NAMES = {"max_tokens": "max_output_tokens", "reasoning_effort": "reasoning.effort"}


def refuse_unserved(r: ResponsesRequest) -> None:
    """Fields whose meaning Corral cannot keep: a 400 naming them rather than an answer
    that silently ignores what was asked."""
    if r.background:
        raise Unsupported("'background' responses are not supported: a response is made while its request waits.", "background")
    if r.conversation is not None:
        raise Unsupported(
            "'conversation' is not supported (Corral keeps no Conversations); continue with 'previous_response_id'.",
            "conversation",
        )
    if r.prompt is not None:
        raise Unsupported("'prompt' (a stored prompt template) is not supported; send 'instructions' and 'input'.", "prompt")
    if r.top_logprobs:
        raise Unsupported("'top_logprobs' is not supported on /v1/responses (chat completions serve logprobs).", "top_logprobs")


def _schemas(r: ResponsesRequest) -> list[tuple[dict[str, Any], str]]:
    fmt = r.text.format if r.text is not None else None
    if fmt is None or fmt.type == "text":
        return []
    if fmt.type == "json_object":
        return [(ANY_OBJECT, "text.format")]
    if fmt.schema is None:
        raise InvalidRequest("Missing required parameter: 'text.format.schema'.", "text.format.schema")
    return [(fmt.schema, "text.format")]


def sampling_params(r: ResponsesRequest, defaults: SamplingParams) -> SamplingParams:
    d = defaults
    params = SamplingParams(
        max_tokens=d.max_tokens if r.max_output_tokens is None else r.max_output_tokens,
        temperature=d.temperature if r.temperature is None else r.temperature,
        top_p=d.top_p if r.top_p is None else r.top_p,
        top_k=d.top_k, min_p=d.min_p, seed=d.seed, repeat_penalty=d.repeat_penalty, repeat_last_n=d.repeat_last_n,
        presence_penalty=d.presence_penalty, frequency_penalty=d.frequency_penalty, stop=d.stop,
    )
    sampling.check(params, lambda f: PARAM_NAMES.get(f, f))
    c = structured.constraint(_schemas(r))
    return params if c is None else msgspec.structs.replace(params, constraint=c)


def template_kwargs(r: ResponsesRequest) -> dict[str, Any] | None:
    if r.reasoning is not None and r.reasoning.effort == "none":
        return {"enable_thinking": False}
    return None


def responses_job(
    r: ResponsesRequest, model: str, defaults: SamplingParams, conversation: tuple[ChatMessage, ...],
    tools: ToolRequest,
) -> GenerationJob:
    """`conversation`: the previous response's, then this request's input; `tools`: its
    tools, checked (router/api/responses/items.py)."""
    system = (ChatMessage(role="system", content=r.instructions),) if r.instructions else ()
    return GenerationJob(
        model=model,
        params=sampling_params(r, defaults),
        messages=system + conversation,
        stream=r.stream,
        tools=tools,
        template_kwargs=template_kwargs(r),
        effort=r.reasoning.effort if r.reasoning is not None else None,
        cache_salt=r.cache_salt,
    )


def echo(r: ResponsesRequest, params: SamplingParams, sent: frozenset[str] | None = None) -> dict[str, Any]:
    """The request's settings as every response object repeats them. `sent`: the fields a
    job for a model served elsewhere carries (GenerationJob.sent); one it does not carry
    is the upstream's to choose, and unknown here (null)."""

    def value(name: str) -> Any:
        return getattr(params, name) if sent is None or name in sent else None

    fmt = r.text.format if r.text is not None and r.text.format is not None else None
    text: dict[str, Any] = {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}}
    return {
        "instructions": r.instructions,
        "max_output_tokens": r.max_output_tokens,
        "max_tool_calls": r.max_tool_calls,
        "metadata": r.metadata or {},
        "parallel_tool_calls": r.parallel_tool_calls is not False,
        "previous_response_id": r.previous_response_id,
        "prompt_cache_key": r.prompt_cache_key,
        "reasoning": {"effort": r.reasoning.effort if r.reasoning else None, "summary": r.reasoning.summary if r.reasoning else None},
        "safety_identifier": r.safety_identifier,
        "service_tier": "default",
        "store": r.store,
        "temperature": value("temperature"),
        "text": text,
        "tool_choice": r.tool_choice if r.tool_choice is not None else "auto",
        "tools": r.tools or [],
        "top_logprobs": 0,
        "top_p": value("top_p"),
        "truncation": r.truncation or "disabled",
        "user": r.user,
    }
