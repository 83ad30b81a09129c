"""llama-server's own request bodies (/completion, /tokenize, /detokenize, /apply-template):
decoding, validation, and conversion to what the worker takes.

Every parameter llama-server's README lists for /completion is accepted by name. Those that
Corral does (or that need nothing, like `cache_prompt`) take effect; samplers Corral does not
have are accepted at their disabled values and refused, naming the parameter, when a request
turns them on, so a client never gets output it did not ask for. Names outside the README
are refused, as on the OpenAI routes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from router.api.openai import fields as request_fields
from router.api.openai import schemas
from router.generation import structured
from router.api.openai.schemas import Int32
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import SamplingParams

# Ids travel as msgpack integers and are checked against the vocabulary in the worker; this
# bound only keeps a huge JSON integer a 400 here.
TokenId = Int32


class NativeCompletionRequest(schemas.SamplingFields, forbid_unknown_fields=True):
    """POST /completion. The sampling parameters and their defaults are the OpenAI routes'
    (which are llama-server's); what follows is /completion's own."""

    prompt: str | list[Any] = ""
    return_tokens: bool = False
    id_slot: Int32 = -1  # accepted, ignored: the slot with the longest cached prefix is taken
    # Accepted with no effect on what is generated.
    n_keep: Int32 = 0
    n_discard: Int32 = 0
    n_cache_reuse: Int32 = 0
    min_keep: Int32 = 0
    t_max_prompt_ms: Int32 = 0
    t_max_predict_ms: Int32 = 0
    samplers: list[str] | str | None = None
    return_progress: bool = False
    post_sampling_probs: bool = False
    sse_ping_interval: float | None = None
    response_fields: list[str] | None = None  # honoured: the final answer holds only these
    # Samplers Corral does not have: accepted at their disabled values only.
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    mirostat: Int32 = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: Int32 = 2
    dry_penalty_last_n: Int32 = -1
    dry_sequence_breakers: list[str] | None = None
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    n_probs: Int32 = 0
    n_indent: Int32 = 0
    n_cmpl: Int32 = 1
    lora: list[Any] | None = None


# Each sampler Corral lacks, with the value that turns it off.
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


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """llama-server's /tokenize, plus `model` to route by."""

    content: str
    model: str | None = None  # None: the server's default model
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    tokens: list[TokenId]
    model: str | None = None


class ApplyTemplateRequest(msgspec.Struct, forbid_unknown_fields=True):
    """What shapes a chat's prompt, as llama-server's /apply-template reads it from a chat
    body: the messages, the tools offered and the extra template variables."""

    messages: list[dict[str, Any]]
    model: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class SlotsQuery(msgspec.Struct, forbid_unknown_fields=True):
    """GET /slots's and /props's query string."""

    model: str | None = None
    fail_on_no_slot: str | None = None


def native_params(r: NativeCompletionRequest, default_max_tokens: int | None = None) -> SamplingParams:
    """The worker's sampling parameters for a /completion request; 400 naming the
    parameter for anything Corral cannot do. `default_max_tokens` is the model's limit
    for a request that sets neither max_tokens nor n_predict (an explicit n_predict = -1
    still means no limit)."""
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
        max_tokens, param = default_max_tokens, "max_tokens"
    else:
        max_tokens, param = request_fields.n_predict_tokens(r.n_predict), "n_predict"
    params = request_fields.sampling_params(r, max_tokens, param, min_tokens=0)
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


class NativeErrorDetail(msgspec.Struct):
    code: int  # the HTTP status, as llama-server writes it
    message: str
    type: str
    param: str | None = None  # Corral's addition: the parameter to fix
    n_prompt_tokens: int | None = None  # exceed_context_size_error only
    n_ctx: int | None = None


class NativeErrorBody(msgspec.Struct):
    """Every error on llama-server's own routes (router/api/llama/errors.py)."""

    error: NativeErrorDetail
