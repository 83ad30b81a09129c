"""OpenAI request bodies: decoding, validation, and conversion to worker frames.

msgspec decodes and type-checks in one pass and names the offending key path; the range
checks msgspec cannot express follow. Every failure is an InvalidRequest that names the
parameter, so the client gets a 400 that says exactly what to fix. Unknown parameters are
rejected, as OpenAI does, rather than silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec

from router import json_path, tool_schemas
from router.prompts import Prompt, prompt_list
from supervisor import msgspec_errors
from supervisor.errors import ContextOverflow, InvalidRequest, Unsupported
from worker.protocol import ChatMessage, Ready, SamplingParams, fewest_tokens, utf8_length

MAX_STOP_STRINGS = 16
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
    """Any JSON object."""


class JsonSchemaFormat(msgspec.Struct, forbid_unknown_fields=True):
    # OpenAI's rule for the name: letters, digits, '_' and '-', at most 64.
    name: Annotated[str, msgspec.Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    # The field is `schema` on the wire; msgspec's own Struct has no such attribute to clash.
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormatJsonSchema(msgspec.Struct, tag="json_schema", tag_field="type", forbid_unknown_fields=True):
    """JSON matching `json_schema.schema`."""

    json_schema: JsonSchemaFormat


ResponseFormat = Union[ResponseFormatText, ResponseFormatJsonObject, ResponseFormatJsonSchema]


_DEFAULT = SamplingParams()


class _Sampling(msgspec.Struct, forbid_unknown_fields=True):
    """Parameters shared by chat and completions (OpenAI's, then llama.cpp's extensions)."""

    model: str | None = None  # None: the server's default_model
    max_tokens: Int32 | None = None
    # What a request leaves unset takes the worker protocol's defaults (llama-server's).
    temperature: float = _DEFAULT.temperature
    top_p: float = _DEFAULT.top_p
    n: Int32 = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    presence_penalty: float = _DEFAULT.presence_penalty
    frequency_penalty: float = _DEFAULT.frequency_penalty
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted and ignored (see IGNORED)
    # llama.cpp extensions, as llama-server names them.
    top_k: Int32 = _DEFAULT.top_k
    min_p: float = _DEFAULT.min_p
    repeat_penalty: float = _DEFAULT.repeat_penalty
    repeat_last_n: Int32 = _DEFAULT.repeat_last_n
    ignore_eos: bool = _DEFAULT.ignore_eos
    # llama-server's own: n_predict stands for max_tokens when that is absent (-1: no
    # limit); cache_prompt is accepted, as Corral always reuses a cached prefix; with
    # timings_per_token, chunks and the answer carry llama-server's `timings`.
    n_predict: Int32 | None = None
    cache_prompt: bool = True
    timings_per_token: bool = False
    # llama-server's structured output: a JSON schema, or a GBNF grammar (router/structured.py).
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None


class ChatRequest(_Sampling, forbid_unknown_fields=True):
    messages: list[dict[str, Any]] = []
    max_completion_tokens: Int32 | None = None
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


class CompletionRequest(_Sampling, forbid_unknown_fields=True):
    # str, [str], or token arrays; msgspec unions allow one list type, so elements are
    # checked in completion_prompt.
    prompt: str | list[Any] = ""
    echo: bool = False
    suffix: str | None = None
    best_of: Int32 | None = None
    logprobs: Int32 | None = None


class EmbeddingRequest(msgspec.Struct, forbid_unknown_fields=True):
    input: str | list[Any]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Int32 | None = None
    user: str | None = None


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """llama-server's /tokenize, plus `model` to route by."""

    content: str
    model: str | None = None  # None: the server's default model
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


def decode(body: bytes | bytearray, kind: type[msgspec.Struct]) -> Any:
    """Decode a JSON body into `kind`; InvalidRequest names the offending parameter."""
    if not body or body.isspace():  # strip() would copy a bytearray; isspace() stops early
        raise InvalidRequest("The request body is empty; expected a JSON object.")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        p = msgspec_errors.problem(exc)
        if p.unknown is not None:
            raise InvalidRequest(f"Unrecognized request argument supplied: {p.key}", p.key) from None
        if p.missing is not None:
            raise InvalidRequest(f"Missing required parameter: '{p.key}'.", p.key) from None
        if not p.path:
            raise InvalidRequest(f"The request body must be a JSON object: {p.message}") from None
        raise InvalidRequest(f"Invalid value for '{p.path}': {p.message}", p.path) from None
    except RecursionError:
        # Free-form fields (tool_choice, an unknown key in a message) are decoded by
        # recursion; a hostile body nested thousands deep must be a 400, not a 500.
        path = json_path.too_deep(body)
        raise InvalidRequest(
            f"Invalid value for '{path}': JSON nested too deeply." if path
            else "The JSON body is nested too deeply.",
            path,
        ) from None
    except UnicodeDecodeError:
        path = json_path.invalid_utf8(body)
        raise InvalidRequest(
            f"Invalid value for '{path}': the string is not valid UTF-8." if path
            else "The request body is not valid UTF-8.",
            path,
        ) from None
    except msgspec.DecodeError:
        raise InvalidRequest(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)"
        ) from None


def _range(name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise InvalidRequest(
            f"Invalid '{name}': expected a value between {lo:g} and {hi:g}, got {value:g}.", name
        )


def sampling_params(
    r: _Sampling, max_tokens: int | None, max_tokens_param: str = "max_tokens", min_tokens: int = 1
) -> SamplingParams:
    """Validate the shared parameters and build the worker's view of them. The token limit
    came from `max_tokens_param` (n_predict, for llama-server's clients), which names it in
    a 400; llama-server's /completion allows 0 (prefill only)."""
    _range("temperature", r.temperature, 0.0, 2.0)
    _range("top_p", r.top_p, 0.0, 1.0)
    _range("presence_penalty", r.presence_penalty, -2.0, 2.0)
    _range("frequency_penalty", r.frequency_penalty, -2.0, 2.0)
    _range("min_p", r.min_p, 0.0, 1.0)
    _range("repeat_penalty", r.repeat_penalty, 0.0, 10.0)
    if r.repeat_penalty == 0.0:  # llama.cpp requires > 0; 1.0 disables it
        raise InvalidRequest("Invalid 'repeat_penalty': must be > 0 (1.0 disables it).", "repeat_penalty")
    if r.top_k < 0:
        raise InvalidRequest("Invalid 'top_k': must be >= 0 (0 disables it).", "top_k")
    if r.repeat_last_n < -1:
        raise InvalidRequest("Invalid 'repeat_last_n': must be >= -1.", "repeat_last_n")
    if max_tokens is not None and max_tokens < min_tokens:
        raise InvalidRequest(
            f"Invalid '{max_tokens_param}': integer below minimum value. Expected a value >= {min_tokens}, "
            f"but got {max_tokens} instead.",
            max_tokens_param,
        )
    if not 1 <= r.n <= MAX_N:
        raise InvalidRequest(f"Invalid 'n': expected a value between 1 and {MAX_N}, got {r.n}.", "n")
    if r.stream_options is not None and not r.stream:
        raise InvalidRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
        )
    stops = [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"At most {MAX_STOP_STRINGS} stop strings are allowed.", "stop")
    if any(not s for s in stops):
        raise InvalidRequest("Stop strings must not be empty.", "stop")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        min_p=r.min_p,
        seed=r.seed,
        repeat_penalty=r.repeat_penalty,
        repeat_last_n=r.repeat_last_n,
        presence_penalty=r.presence_penalty,
        frequency_penalty=r.frequency_penalty,
        stop=stops,
        ignore_eos=r.ignore_eos,
        timings_per_token=r.timings_per_token,
        logit_bias=logit_bias(r.logit_bias),
    )


def n_predict_tokens(n_predict: int | None, param: str = "n_predict") -> int | None:
    """llama-server's n_predict as a token limit: -1 (its default) is none; other values
    below -1 are a 400."""
    if n_predict is None or n_predict == -1:
        return None
    if n_predict < -1:
        raise InvalidRequest(f"Invalid '{param}': expected -1 (no limit) or a value >= 0, got {n_predict}.", param)
    return n_predict


def logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's `{"token id": bias}` with its ids parsed; biases within -100..100. Ids past
    the model's vocabulary are the worker's to refuse (it knows the vocabulary)."""
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        if not (key.isascii() and key.isdigit()) or int(key) > 2**31 - 1:
            raise InvalidRequest(
                f"Invalid key in 'logit_bias': {key!r} is not a token id (a non-negative integer).",
                "logit_bias",
            )
        if not -LOGIT_BIAS_RANGE <= value <= LOGIT_BIAS_RANGE:  # NaN fails this too
            raise InvalidRequest(
                f"Invalid value in 'logit_bias' for token {key}: expected a value between -100 and 100, got {value}.",
                "logit_bias",
            )
        out[int(key)] = value
    return out


def chat_logprobs(r: ChatRequest) -> int | None:
    """How many alternatives each token's logprobs carry (None: no logprobs)."""
    if r.top_logprobs is not None:
        if not r.logprobs:
            raise InvalidRequest("'logprobs' must be set to true when 'top_logprobs' is used.", "top_logprobs")
        if not 0 <= r.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(
                f"Invalid 'top_logprobs': expected a value between 0 and {MAX_TOP_LOGPROBS}, got {r.top_logprobs}.",
                "top_logprobs",
            )
    return (r.top_logprobs or 0) if r.logprobs else None


def completion_logprobs(r: CompletionRequest) -> int | None:
    """The legacy API's `logprobs`: the number of alternatives (OpenAI allows 0..5; as
    llama-server, more are allowed, up to chat's 20)."""
    if r.logprobs is None:
        return None
    if not 0 <= r.logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(
            f"Invalid 'logprobs': expected a value between 0 and {MAX_TOP_LOGPROBS}, got {r.logprobs}.", "logprobs"
        )
    if r.echo:
        raise Unsupported("logprobs with echo is not supported (the prompt's tokens have none).", "echo")
    return r.logprobs


_ROLES = {"system", "user", "assistant", "developer", "tool"}


def chat_messages(r: ChatRequest) -> list[ChatMessage]:
    """Normalise OpenAI messages (string or text-part content) for the chat template."""
    if not r.messages:
        raise InvalidRequest("'messages' must contain at least one message.", "messages")
    out: list[ChatMessage] = []
    for i, m in enumerate(r.messages):
        at = f"messages[{i}]"
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise InvalidRequest(
                f"Invalid value for '{at}.role': expected one of {sorted(_ROLES)}.", f"{at}.role"
            )
        calls = m.get("tool_calls")
        tool_calls = None
        if calls is not None:
            if role != "assistant":
                raise InvalidRequest(f"'{at}.tool_calls' is only allowed on assistant messages.", f"{at}.tool_calls")
            tool_calls = tool_schemas.message_tool_calls(at, calls) or None
        tool_call_id = tool_schemas.optional_string(at, m, "tool_call_id")
        if role == "tool" and tool_call_id is None:
            raise InvalidRequest(f"Missing required parameter: '{at}.tool_call_id'.", f"{at}.tool_call_id")
        content = m.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise Unsupported(
                        f"Only text content parts are supported ({at}.content[{j}]).",
                        f"{at}.content[{j}]",
                    )
                t = part.get("text")
                if not isinstance(t, str):
                    raise InvalidRequest(
                        f"'{at}.content[{j}].text' must be a string.", f"{at}.content[{j}].text"
                    )
                parts.append(t)
            text = "".join(parts)
        else:
            raise InvalidRequest(
                f"Invalid type for '{at}.content': expected a string or an array of parts.",
                f"{at}.content",
            )
        # "developer" is OpenAI's newer name for the system role; templates know "system".
        out.append(
            ChatMessage(
                role="system" if role == "developer" else role,
                content=text,
                name=tool_schemas.optional_string(at, m, "name"),
                tool_calls=tool_calls,
                tool_call_id=tool_call_id,
                reasoning_content=tool_schemas.optional_string(at, m, "reasoning_content"),
            )
        )
    # A final assistant message is continued (prefill); two at the end leave no turn to
    # continue, only a conversation that does not alternate.
    if len(out) >= 2 and out[-1].role == out[-2].role == "assistant":
        raise InvalidRequest(
            "'messages' ends with two assistant messages; a final assistant message is continued "
            "(prefill), so at most one may end the conversation.",
            "messages",
        )
    return out


# Template variables the worker sets from the request itself; chat_template_kwargs may not
# set them too (a second `messages` broke rendering, and `tools` passed the template a
# value the request never offered).
TEMPLATE_OWN_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")


def chat_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    """The request's extra chat template variables, without the ones Corral sets itself."""
    for key in TEMPLATE_OWN_VARIABLES:
        if kwargs is not None and key in kwargs:
            raise InvalidRequest(
                f"Invalid 'chat_template_kwargs.{key}': Corral sets this template variable from the "
                f"request itself ({', '.join(TEMPLATE_OWN_VARIABLES)}); send messages and tools as "
                "their own parameters.",
                f"chat_template_kwargs.{key}",
            )
    return kwargs


def completion_prompts(r: CompletionRequest) -> list[Prompt]:
    """The request's prompts: each gives n choices (choice index = prompt index * n + j)."""
    prompts = prompt_list(r.prompt, "prompt")
    if len(prompts) * r.n > MAX_N * 8:
        raise InvalidRequest(f"{len(prompts)} prompts times n = {r.n} choices is too many; at most {MAX_N * 8}.", "n")
    if r.suffix:
        raise Unsupported("suffix is not supported.", "suffix")
    if r.best_of not in (None, 1):
        raise Unsupported("best_of > 1 is not supported.", "best_of")
    return prompts


def embedding_inputs(r: EmbeddingRequest) -> list[str] | list[tuple[int, ...]]:
    """The texts, or the token arrays, to embed (OpenAI takes either, not a mix)."""
    if r.dimensions is not None:
        raise Unsupported("dimensions is not supported.", "dimensions")
    if isinstance(r.input, list) and not r.input:
        raise InvalidRequest("'input' must not be empty.", "input")
    inputs = prompt_list(r.input, "input")
    texts = [x for x in inputs if isinstance(x, str)]
    if texts and len(texts) != len(inputs):
        raise InvalidRequest("'input' mixes strings and token arrays; send one kind.", "input")
    if not texts:
        return [x for x in inputs if not isinstance(x, str)]
    for i, x in enumerate(texts):
        if not x:
            raise InvalidRequest(f"'input[{i}]' must not be an empty string.", "input")
    return texts


# ---- texts that certainly cannot fit -----------------------------------------------------------


def bounded_text(prompt: str | None, messages: list[ChatMessage] | None) -> str:
    """The text a prompt certainly contains, whatever its chat template: a completion's
    prompt, or a chat's last user message without surrounding whitespace. Templates may
    trim content, drop roles they do not know, or strip old reasoning, but every one writes
    the question it is asked to answer."""
    if messages is None:
        return prompt or ""
    return next((m.content for m in reversed(messages) if m.role == "user"), "").strip()


def refuse_if_too_long(ready: Ready | None, text: str, most: int, what: str, why: str, param: str) -> None:
    """ContextOverflow when `text` alone certainly makes more than `most` tokens.

    This spares the worker a text it would refuse anyway: a 15 MB prompt is refused here
    in the time it takes to read it, instead of crossing to the worker to be rendered and
    measured there. It errs in one direction only; the worker checks the whole rendered
    prompt exactly.
    """
    if ready is None or not ready.max_token_bytes or len(text) <= most:
        return  # each token covers at least one byte: a short text needs no bound
    n_bytes = utf8_length(text)
    at_least = fewest_tokens(n_bytes, ready.max_token_bytes)
    if at_least > most:
        raise ContextOverflow(
            f"{what} is at least {at_least} tokens ({n_bytes} bytes of text); {why}", param,
            n_prompt_tokens=at_least, n_ctx=ready.n_ctx_slot,
        )
