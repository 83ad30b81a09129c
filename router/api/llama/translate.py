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

from router.api.llama.schemas import InfillRequest, NativeCompletionRequest
from router.api.openai import fields as request_fields
from router.generation import adapters, media, structured
from router.generation.job import GenerationJob
from router.generation.prompts import Prompt, prompt_list
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import Infill, InfillChunk, SamplingParams

_OFF: dict[str, object] = {
    "dynatemp_range": 0.0,
    "typical_p": 1.0,
    "top_n_sigma": -1.0,
    "mirostat": 0,
    "dry_multiplier": 0.0,
    "xtc_probability": 0.0,
    "n_indent": 0,
    "n_cmpl": 1,
}

MAX_N_PROBS = 100  # candidates per token: llama-server sets no bound, one pass costs more with each


def native_params(r: NativeCompletionRequest, defaults: SamplingParams = SamplingParams()) -> SamplingParams:
    """The worker's sampling parameters for a /completion request; 400 naming the
    parameter for anything Corral cannot do. `defaults` is what the model gives a request
    that sets nothing; its token limit applies when the request sets neither max_tokens
    nor n_predict (an explicit n_predict = -1 still means no limit)."""
    for name, off in _OFF.items():
        value = getattr(r, name)
        if value != off:
            raise Unsupported(f"'{name}' is not supported (only its default, {off}, is accepted).", name)
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
    if r.n_probs:
        if not 0 < r.n_probs <= MAX_N_PROBS:
            raise InvalidRequest(f"Invalid 'n_probs': expected a value from 0 to {MAX_N_PROBS}, got {r.n_probs}.", "n_probs")
        if r.post_sampling_probs:
            # The sampler chain's own distribution (after top_k, top_p, min_p and
            # temperature) is not what Corral reads; the model's would be a wrong answer.
            raise Unsupported(
                "'post_sampling_probs' is not supported: n_probs gives the model's probabilities, before sampling.",
                "post_sampling_probs",
            )
        params = msgspec.structs.replace(params, logprobs=r.n_probs)
    return params if constraint is None else msgspec.structs.replace(params, constraint=constraint)


def native_prompts(r: NativeCompletionRequest) -> list[Prompt]:
    """The prompts, as llama-server reads `prompt` (server-common.cpp,
    tokenize_input_prompts): a string, ids and strings mixed, an object, or a list of
    those, each answered on its own."""
    return prompt_list(r.prompt, "prompt")


def completion_job(r: NativeCompletionRequest, model: str, defaults: SamplingParams) -> GenerationJob:
    """`model`: the name the answer gives (the request's, or the default model's)."""
    params = native_params(r, defaults)  # its 400s before the prompt's, as before
    if isinstance(r.prompt, dict) and "multimodal_data" in r.prompt:
        text, images = media.multimodal_prompt(r.prompt, "prompt")
        return GenerationJob(
            model=model, params=params, prompt=text, media=tuple(images), stream=r.stream, cache_salt=r.cache_salt,
            lora=adapters.requested(r.lora),
        )
    prompts = native_prompts(r)
    if len(prompts) > 1:  # one answer each, in order: `index` tells them apart
        return GenerationJob(
            model=model, params=params, prompt_list=tuple(prompts), stream=r.stream, cache_salt=r.cache_salt,
            lora=adapters.requested(r.lora),
        )
    (prompt,) = prompts
    return GenerationJob(
        model=model,
        params=params,
        prompt=prompt if isinstance(prompt, str) else None,
        prompt_parts=tuple(prompt) if not isinstance(prompt, str) else None,
        stream=r.stream,
        cache_salt=r.cache_salt,
        lora=adapters.requested(r.lora),
    )


def infill_job(r: InfillRequest, model: str, defaults: SamplingParams) -> GenerationJob:
    """An /infill request as a job whose prompt the worker lays out (worker/infill.py);
    its 400s in llama-server's words (server-context.cpp, post_infill)."""
    params = native_params(r, defaults)
    if not isinstance(r.prompt, str):
        raise InvalidRequest('"prompt" must be a string', "prompt")
    extra: list[InfillChunk] = []
    if r.input_extra is not None:
        if not isinstance(r.input_extra, list):
            raise InvalidRequest(
                '"input_extra" must be an array of {"filename": string, "text": string}', "input_extra"
            )
        for i, chunk in enumerate(r.input_extra):
            text = chunk.get("text") if isinstance(chunk, dict) else None
            if not isinstance(text, str):
                raise InvalidRequest(
                    f'extra_context chunk must contain a "text" field with a string value (input_extra[{i}])',
                    "input_extra",
                )
            name = chunk.get("filename", "tmp")
            if not isinstance(name, str):
                raise InvalidRequest(
                    f'extra_context chunk\'s "filename" field must be a string (input_extra[{i}])', "input_extra"
                )
            extra.append(InfillChunk(text=text, filename=name))
    sides: list[list[int | str]] = []
    for param, value in (("input_prefix", r.input_prefix), ("input_suffix", r.input_suffix)):
        if value is None:
            raise InvalidRequest(f'"{param}" is required', param)
        # llama-server's tokenize_mixed: a text, or texts and token ids in one list
        parts: list[int | str] = [value] if isinstance(value, str) else list(value)
        if not all(isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)) for x in parts):
            raise InvalidRequest(f'"{param}" must be a string, or token ids and strings in one list', param)
        sides.append(parts)
    infill = Infill(prefix=sides[0], suffix=sides[1], extra=extra, prompt=r.prompt)
    return GenerationJob(
        model=model, params=params, infill=infill, stream=r.stream, cache_salt=r.cache_salt, lora=adapters.requested(r.lora)
    )
