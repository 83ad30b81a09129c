"""llama-server's /completion body translated into the internal generation request
(router/generation/job.py).

Every parameter llama-server's README lists for /completion is accepted by name (the
Struct in schemas.py). Those that Corral does (or that need nothing, like `cache_prompt`)
take effect; samplers Corral does not have are accepted at their disabled values and
refused, naming the parameter, when a request turns them on, so a client never gets
output it did not ask for.
"""

from __future__ import annotations

import msgspec

from router.api.llama.schemas import NativeCompletionRequest
from router.api.openai import fields as request_fields
from router.generation import structured
from router.generation.job import GenerationJob
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import SamplingParams

_OFF: dict[str, object] = {
    "dynatemp_range": 0.0,
    "typical_p": 1.0,
    "top_n_sigma": -1.0,
    "mirostat": 0,
    "dry_multiplier": 0.0,
    "xtc_probability": 0.0,
    "n_probs": 0,
    "n_indent": 0,
    "n_cmpl": 1,
}



def native_params(r: NativeCompletionRequest, defaults: SamplingParams = SamplingParams()) -> SamplingParams:
    """The worker's sampling parameters for a /completion request; 400 naming the
    parameter for anything Corral cannot do. `defaults` is what the model gives a request
    that sets nothing; its token limit applies when the request sets neither max_tokens
    nor n_predict (an explicit n_predict = -1 still means no limit)."""
    for name, off in _OFF.items():
        value = getattr(r, name)
        if value != off:
            raise Unsupported(f"'{name}' is not supported (only its default, {off}, is accepted).", name)
    if r.lora:
        raise Unsupported("LoRA adapters are not supported.", "lora")
    constraint = structured.constraint(request_fields.json_schemas(None, r.json_schema), r.grammar)
    if r.seed is not None and not -1 <= r.seed <= 0xFFFFFFFF:
        raise InvalidRequest("Invalid 'seed': expected -1 (random) or a value from 0 to 4294967295.", "seed")
    max_tokens: int | None
    if r.max_tokens is not None:  # llama-server takes max_tokens for n_predict
        max_tokens, param = r.max_tokens, "max_tokens"
    elif r.n_predict is None:
        max_tokens, param = defaults.max_tokens, "max_tokens"
    else:
        max_tokens, param = request_fields.n_predict_tokens(r.n_predict), "n_predict"
    params = request_fields.sampling_params(r, max_tokens, param, min_tokens=0, defaults=defaults)
    return params if constraint is None else msgspec.structs.replace(params, constraint=constraint)


def native_prompt(r: NativeCompletionRequest) -> str | list[int | str]:
    """The prompt as the worker takes it: a string, or llama-server's mixed prompt (token
    ids and strings, tokenized in place). A list of several prompts would need one answer
    each, which Corral does not do: 400 naming `prompt`."""
    p = r.prompt
    if isinstance(p, str):
        return p
    if len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # one prompt, wrapped: ["text"] or [[ids...]]
        if isinstance(p, str):
            return p
    parts: list[int | str] = []
    for i, x in enumerate(p):
        if isinstance(x, bool) or not isinstance(x, (int, str)):
            if isinstance(x, (list, dict)):  # several prompts, or a multimodal one
                raise Unsupported("Only one prompt per request is supported on /completion.", "prompt")
            raise InvalidRequest(f"Invalid value for 'prompt[{i}]': expected a token id or a string.", f"prompt[{i}]")
        if isinstance(x, int) and not -(2**31) <= x < 2**31:
            raise InvalidRequest(f"Invalid token id {x} at prompt[{i}].", "prompt")
        parts.append(x)
    if parts and all(isinstance(x, str) for x in parts):
        # ["a", "b"] is two prompts to llama-server, not one mixed prompt.
        raise Unsupported("Only one prompt per request is supported on /completion.", "prompt")
    if not parts:
        raise InvalidRequest("'prompt' must not be empty.", "prompt")
    return parts


def completion_job(r: NativeCompletionRequest, model: str, defaults: SamplingParams) -> GenerationJob:
    """`model`: the name the answer gives (the request's, or the default model's)."""
    params = native_params(r, defaults)  # its 400s before the prompt's, as before
    prompt = native_prompt(r)
    return GenerationJob(
        model=model,
        params=params,
        prompt=prompt if isinstance(prompt, str) else None,
        prompt_parts=tuple(prompt) if not isinstance(prompt, str) else None,
        stream=r.stream,
    )
