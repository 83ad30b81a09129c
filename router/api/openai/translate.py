"""OpenAI's chat and completions bodies, translated into the internal generation request
(router/generation/job.py)."""

from __future__ import annotations

import msgspec

from router.api.openai import fields as request_fields
from router.api.openai import schemas
from router.generation import adapters, media, structured, tool_schemas
from router.generation.prompts import Prompt
from router.generation.job import GenerationJob
from router.server import auth
from supervisor import priority
from worker.protocol import Constraint, SamplingParams


def chat_job(r: schemas.ChatRequest, model: str, defaults: SamplingParams = SamplingParams()) -> GenerationJob:
    """`model` is the name the response gives: the request's, or the default model's;
    `defaults` what the model gives a request that sets nothing (its token limit too)."""
    request_fields.check_metadata(r.metadata)
    max_tokens = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
    param = "max_tokens"
    if max_tokens is None and r.n_predict is not None:
        max_tokens, param = request_fields.n_predict_tokens(r.n_predict), "n_predict"
    elif max_tokens is None:
        max_tokens = defaults.max_tokens
    params = request_fields.sampling_params(r, max_tokens, param, defaults=defaults)
    params = msgspec.structs.replace(params, logprobs=request_fields.chat_logprobs(r))
    return GenerationJob(
        model=model,
        params=_constrained(params, structured.constraint(request_fields.json_schemas(r.response_format, r.json_schema), r.grammar)),
        messages=tuple(request_fields.chat_messages(r)),
        stream=r.stream,
        include_usage=_include_usage(r),
        tools=tool_schemas.tool_request(r.tools, r.tool_choice, r.parallel_tool_calls),
        template_kwargs=request_fields.chat_template_kwargs(r.chat_template_kwargs),
        n=r.n,
        add_generation_prompt=request_fields.generation_prompt(r),
        effort=r.reasoning_effort,
        cache_salt=r.cache_salt,
        priority=priority.requested(auth.current_key(), r.priority),
        lora=adapters.requested(r.lora),
    )


def completion_job(r: schemas.CompletionRequest, model: str, defaults: SamplingParams = SamplingParams()) -> GenerationJob:
    max_tokens, param = _completion_max_tokens(r, defaults.max_tokens)
    params = request_fields.sampling_params(r, max_tokens, param, defaults=defaults)
    params = msgspec.structs.replace(params, logprobs=request_fields.completion_logprobs(r))
    prompts: list[Prompt]
    if isinstance(r.prompt, dict) and "multimodal_data" in r.prompt:  # llama-server's, with images
        text, images = media.multimodal_prompt(r.prompt, "prompt")
        prompts, shown = [text], tuple(images)
    else:
        prompts, shown = request_fields.completion_prompts(r), ()
    one = prompts[0] if len(prompts) == 1 and isinstance(prompts[0], str) else None
    return GenerationJob(
        media=shown,
        model=model,
        params=_constrained(params, structured.constraint(request_fields.json_schemas(None, r.json_schema), r.grammar)),
        prompt=one,
        prompt_list=None if one is not None else tuple(prompts),
        stream=r.stream,
        include_usage=_include_usage(r),
        n=r.n,
        echo=r.echo,
        cache_salt=r.cache_salt,
        priority=priority.requested(auth.current_key(), r.priority),
        lora=adapters.requested(r.lora),
    )


def _completion_max_tokens(r: schemas.CompletionRequest, default: int | None) -> tuple[int | None, str]:
    """The token limit and the parameter it came from."""
    if r.max_tokens is not None:
        return r.max_tokens, "max_tokens"
    if r.n_predict is not None:
        return request_fields.n_predict_tokens(r.n_predict), "n_predict"
    # The model's own default, else OpenAI's for the legacy completions endpoint.
    return (default if default is not None else 16), "max_tokens"


def _constrained(params: SamplingParams, c: Constraint | None) -> SamplingParams:
    return params if c is None else msgspec.structs.replace(params, constraint=c)


def _include_usage(r: schemas.SamplingFields) -> bool:
    return bool(r.stream and r.stream_options and r.stream_options.include_usage)
