"""OpenAI request bodies: their shapes (and the shape of its errors, for GET /openapi.json).

msgspec decodes and type-checks in one pass (router/server/json_body.py) and names the
offending key path; the range checks msgspec cannot express follow
(router/api/openai/fields.py). Unknown parameters are rejected, as OpenAI does, rather than
silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec

from router.server.cache_scope import Salt
from worker.protocol import SamplingParams
MAX_N = 128  # choices per prompt, as OpenAI
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs and completions' logprobs, as OpenAI's chat
LOGIT_BIAS_RANGE = 100.0

# Integers are bounded at decode time: the worker frames are msgpack, which holds at most
# 64 bits, and an unbounded JSON integer must be a 400 naming its parameter, not a 500.
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # int64, as OpenAI


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False


# ---- response_format: OpenAI's three shapes, told apart by "type" --------------------------


class ResponseFormatText(msgspec.Struct, tag="text", tag_field="type", forbid_unknown_fields=True):
    """Free text: no constraint."""


class ResponseFormatJsonObject(msgspec.Struct, tag="json_object", tag_field="type", forbid_unknown_fields=True):
    """Any JSON object; with `schema` (llama-server's extension, which instructor's
    JSON_SCHEMA mode sends), JSON matching that schema instead."""

    # The field is `schema` on the wire; msgspec's own Struct has no such attribute to clash.
    schema: dict[str, Any] | None = None


class JsonSchemaFormat(msgspec.Struct, forbid_unknown_fields=True):
    # OpenAI's rule for the name: letters, digits, '_' and '-', at most 64. OpenAI requires
    # it; llama-server and vLLM do not (llama.cpp's test_completion_with_response_format
    # sends none), and it changes nothing of the output.
    name: Annotated[str, msgspec.Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")] | None = None
    # The field is `schema` on the wire; msgspec's own Struct has no such attribute to clash.
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormatJsonSchema(msgspec.Struct, tag="json_schema", tag_field="type", forbid_unknown_fields=True):
    """JSON matching `json_schema.schema`."""

    json_schema: JsonSchemaFormat


ResponseFormat = Union[ResponseFormatText, ResponseFormatJsonObject, ResponseFormatJsonSchema]


_DEFAULT = SamplingParams()


class SamplingFields(msgspec.Struct, forbid_unknown_fields=True):
    """Parameters shared by chat and completions (OpenAI's, then llama.cpp's extensions)."""

    model: str | None = None  # None: the server's default_model
    max_tokens: Int32 | None = None
    # What a request leaves unset (or sends as null) takes the model's defaults: its
    # config's, else the worker protocol's (llama-server's).
    temperature: float | None = None
    top_p: float | None = None
    n: Int32 = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # OpenAI's {"token id": bias}; llama-server's also takes text keys, [[id or text,
    # bias], ...] and `false` for a ban (router/api/openai/fields.py, logit_bias).
    logit_bias: dict[str, float | bool] | list[Any] | None = None
    user: str | None = None  # accepted and ignored (see IGNORED)
    # llama.cpp extensions, as llama-server names them.
    top_k: Int32 | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: Int32 | None = None
    ignore_eos: bool = _DEFAULT.ignore_eos
    # llama-server's own: n_predict stands for max_tokens when that is absent (-1: no
    # limit); cache_prompt is accepted, as Corral always reuses a cached prefix; with
    # timings_per_token, chunks and the answer carry llama-server's `timings`.
    n_predict: Int32 | None = None
    cache_prompt: bool = True
    id_slot: Int32 = -1  # llama-server's; accepted, ignored: the slot with the longest cached prefix is taken
    timings_per_token: bool = False
    # llama-server's structured output: a JSON schema, or a GBNF grammar (router/generation/structured.py).
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    # vLLM's: requests with different salts share no cached prefix, even under one key
    # (router/server/cache_scope.py).
    cache_salt: Salt | None = None
    # llama-server's: [{id, scale}] of the model's LoRA adapters, the others at 0
    # (router/generation/adapters.py).
    lora: list[Any] | None = None


class ChatRequest(SamplingFields, forbid_unknown_fields=True):
    messages: list[dict[str, Any]] = []
    max_completion_tokens: Int32 | None = None
    # llama-server's (and vLLM's): whether the template opens the assistant's turn, and
    # whether the last (assistant) message is continued instead of answered.
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    # llama-server's: the answer carries `__verbose` with the rendered prompt (None: the
    # server's [server] verbose_responses).
    verbose: bool | None = None
    logprobs: bool | None = None
    top_logprobs: Int32 | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # llama-server's extra chat template variables, e.g. {"enable_thinking": false}.
    chat_template_kwargs: dict[str, Any] | None = None
    # Accepted and ignored (IGNORED says why): typed as OpenAI types them, so a wrong type
    # is still a 400 naming the field.
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prediction: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # vLLM's: lower is served earlier; its sign picks the slot line's class, where the key
    # may choose (supervisor/priority.py).
    priority: Int32 | None = None


# Fields of OpenAI's request schemas that Corral accepts and does not act on, and why. Any
# other unknown field is a 400 naming it, as OpenAI answers.
IGNORED: dict[str, str] = {
    "user": "an end-user id for OpenAI's abuse monitoring; nothing to monitor here",
    "safety_identifier": "the same, under its newer name",
    "metadata": "tags for OpenAI's stored completions; Corral stores nothing",
    "store": "Corral stores no completions",
    "service_tier": "there is one tier: the local machine",
    "prediction": "predicted outputs (speculative decoding) are not implemented",
    "modalities": "text is the only modality the workers produce",
    "audio": "no audio output",
    "reasoning_effort": "a reasoning model's template decides how it thinks "
    "(see chat_template_kwargs)",
    "verbosity": "an OpenAI model setting with no llama.cpp equivalent",
    "web_search_options": "no web search",
    "prompt_cache_key": "prefix caching is automatic in every worker",
}


class CompletionRequest(SamplingFields, forbid_unknown_fields=True):
    # str, [str], token arrays, or llama-server's mixed and object forms; msgspec unions
    # allow one list type, so elements are checked in router/generation/prompts.py.
    prompt: str | list[Any] | dict[str, Any] = ""
    echo: bool = False
    suffix: str | None = None
    best_of: Int32 | None = None
    logprobs: Int32 | None = None
    priority: Int32 | None = None  # as ChatRequest's


class EmbeddingRequest(msgspec.Struct, forbid_unknown_fields=True):
    input: str | list[Any] | dict[str, Any]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Int32 | None = None
    user: str | None = None


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(msgspec.Struct):
    """Every 4xx and 5xx on the OpenAI routes (router/api/openai/errors.py builds it)."""

    error: ErrorDetail
