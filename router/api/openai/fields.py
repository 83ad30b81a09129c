"""OpenAI's request fields, checked beyond their types and turned into what the internal
request holds: sampling parameters, chat messages, prompts, embedding inputs, logprob
counts, the schemas that constrain the output. llama-server's routes take the same fields
and share these; the request shapes themselves are in router/api/openai/schemas.py. Every
failure is an InvalidRequest that names the parameter.
"""

from __future__ import annotations

from typing import Any

import msgspec

from router.generation import media, sampling, tool_schemas
from router.generation.prompts import Prompt, prompt_list
from router.generation.structured import ANY_OBJECT
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import LOGIT_BAN, MEDIA_MARKER, TEMPLATE_OWN_VARIABLES, ChatMessage, Media, SamplingParams
from router.api.openai.schemas import (
    LOGIT_BIAS_RANGE, MAX_N, MAX_TOP_LOGPROBS, ChatRequest, CompletionRequest, EmbeddingRequest,
    ResponseFormat, ResponseFormatJsonObject, ResponseFormatJsonSchema, SamplingFields,
)


def sampling_params(
    r: SamplingFields,
    max_tokens: int | None,
    max_tokens_param: str = "max_tokens",
    min_tokens: int = 1,
    defaults: SamplingParams = SamplingParams(),
) -> SamplingParams:
    """Validate the shared parameters and build the worker's view of them; what the
    request leaves unset comes from the model's `defaults`. The token limit came from
    `max_tokens_param` (n_predict, for llama-server's clients), which names it in a 400;
    llama-server's /completion allows 0 (prefill only)."""
    stops = defaults.stop if r.stop is None else [r.stop] if isinstance(r.stop, str) else list(r.stop)
    d = defaults
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=d.temperature if r.temperature is None else r.temperature,
        top_p=d.top_p if r.top_p is None else r.top_p,
        top_k=d.top_k if r.top_k is None else r.top_k,
        min_p=d.min_p if r.min_p is None else r.min_p,
        seed=d.seed if r.seed is None else r.seed,
        repeat_penalty=d.repeat_penalty if r.repeat_penalty is None else r.repeat_penalty,
        repeat_last_n=d.repeat_last_n if r.repeat_last_n is None else r.repeat_last_n,
        presence_penalty=d.presence_penalty if r.presence_penalty is None else r.presence_penalty,
        frequency_penalty=d.frequency_penalty if r.frequency_penalty is None else r.frequency_penalty,
        stop=stops,
        ignore_eos=r.ignore_eos,
        timings_per_token=r.timings_per_token,
    )
    sampling.check(params, lambda f: max_tokens_param if f == "max_tokens" else f, min_tokens)
    if not 1 <= r.n <= MAX_N:
        raise InvalidRequest(f"Invalid 'n': expected a value between 1 and {MAX_N}, got {r.n}.", "n")
    if r.stream_options is not None and not r.stream:
        raise InvalidRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
        )
    sampling.check_stops(stops)
    ids, texts = logit_bias(r.logit_bias)
    return msgspec.structs.replace(params, logit_bias=ids, logit_bias_text=texts)


def n_predict_tokens(n_predict: int | None, param: str = "n_predict") -> int | None:
    """llama-server's n_predict as a token limit: -1 (its default) is none; other values
    below -1 are a 400."""
    if n_predict is None or n_predict == -1:
        return None
    if n_predict < -1:
        raise InvalidRequest(f"Invalid '{param}': expected -1 (no limit) or a value >= 0, got {n_predict}.", param)
    return n_predict


# Text keys a request may bias, and how long each may be: each is tokenized by the worker.
MAX_LOGIT_BIAS_TEXTS = 1024
MAX_LOGIT_BIAS_TEXT_BYTES = 1024


def logit_bias(bias: dict[str, float | bool] | list[Any] | None) -> tuple[dict[int, float], dict[str, float]]:
    """logit_bias in every form llama-server takes (server-schema.cpp, "logit_bias"):
    OpenAI's `{"token id": bias}`, `{"text": bias}`, `[[id, bias], ["text", bias], ...]`;
    a bias is -100..100 (OpenAI's range), or `false` to ban the token. Returns the ids'
    biases and the texts' (tokenized by the worker). Ids past the model's vocabulary are
    the worker's to refuse (it knows the vocabulary); llama-server skips them silently."""
    ids: dict[int, float] = {}
    texts: dict[str, float] = {}
    if bias is None:
        return ids, texts
    if isinstance(bias, dict):
        entries: list[tuple[object, object, str]] = [(k, v, f"logit_bias.{k}") for k, v in bias.items()]
    else:
        entries = []
        for i, el in enumerate(bias):
            if not isinstance(el, list) or len(el) != 2:
                raise InvalidRequest(f"Invalid value for 'logit_bias[{i}]': expected [token id or text, bias].", "logit_bias")
            entries.append((el[0], el[1], f"logit_bias[{i}]"))
    for key, value, where in entries:
        amount = _bias_value(value, where)
        if isinstance(key, str) and key.isascii() and key.removeprefix("-").isdigit():
            key = int(key)  # an id, as strtol reads it; a negative one is refused below
        if isinstance(key, int) and not isinstance(key, bool):
            if not 0 <= key <= 2**31 - 1:
                raise InvalidRequest(f"Invalid key in '{where}': {key} is not a token id.", "logit_bias")
            ids[key] = amount
        elif isinstance(key, str) and key:
            if len(key.encode()) > MAX_LOGIT_BIAS_TEXT_BYTES:
                raise InvalidRequest(f"Invalid key in '{where}': at most {MAX_LOGIT_BIAS_TEXT_BYTES} bytes of text.", "logit_bias")
            texts[key] = amount
        else:
            raise InvalidRequest(f"Invalid key in '{where}': expected a token id or a text.", "logit_bias")
    if len(texts) > MAX_LOGIT_BIAS_TEXTS:
        raise InvalidRequest(f"Invalid 'logit_bias': at most {MAX_LOGIT_BIAS_TEXTS} text keys.", "logit_bias")
    return ids, texts


def _bias_value(value: object, where: str) -> float:
    if value is False:
        return LOGIT_BAN
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if -LOGIT_BIAS_RANGE <= value <= LOGIT_BIAS_RANGE:  # NaN fails this too
            return float(value)
    raise InvalidRequest(
        f"Invalid value in '{where}': expected a value between -100 and 100, or false to ban the token; got {value!r}.",
        "logit_bias",
    )


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


DETAILS = ("auto", "low", "high")  # image_url.detail: accepted, and of no effect here


def content_parts(at: str, content: list[Any]) -> tuple[str, list[Media]]:
    """A message's content parts: the texts joined, with a media marker where each image or
    sound stands, and the images and sounds (router/generation/media.py)."""
    texts: list[str] = []
    images: list[Media] = []
    for j, part in enumerate(content):
        where = f"{at}.content[{j}]"
        if not isinstance(part, dict):
            raise InvalidRequest(f"Invalid type for '{where}': expected a content part object.", where)
        kind = part.get("type")
        if kind == "text":
            t = part.get("text")
            if not isinstance(t, str):
                raise InvalidRequest(f"'{where}.text' must be a string.", f"{where}.text")
            texts.append(t)
        elif kind == "image_url":
            value = part.get("image_url")
            url = value.get("url") if isinstance(value, dict) else value
            detail = value.get("detail") if isinstance(value, dict) else None
            if detail is not None and detail not in DETAILS:
                raise InvalidRequest(
                    f"Invalid value for '{where}.image_url.detail': expected one of {list(DETAILS)}.", f"{where}.image_url.detail"
                )
            if url is None:
                raise InvalidRequest(f"Missing required parameter: '{where}.image_url.url'.", f"{where}.image_url.url")
            images.append(media.from_url(url, f"{where}.image_url.url" if isinstance(value, dict) else f"{where}.image_url"))
            texts.append(MEDIA_MARKER)
        elif kind == "input_audio":
            images.append(media.from_input_audio(part.get("input_audio"), f"{where}.input_audio"))
            texts.append(MEDIA_MARKER)
        elif kind in ("file", "refusal"):
            raise Unsupported(f"Content parts of type '{kind}' are not supported ({where}).", where)
        else:
            raise InvalidRequest(
                f"Invalid value for '{where}.type': expected 'text', 'image_url' or 'input_audio'.", f"{where}.type"
            )
    return "".join(texts), images


def chat_messages(r: ChatRequest) -> list[ChatMessage]:
    """Normalise OpenAI messages (string or text-part content) for the chat template."""
    if not r.messages:
        raise InvalidRequest("'messages' must contain at least one message.", "messages")
    out: list[ChatMessage] = []
    seen: list[Media] = []  # the request's images so far
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
        before = len(seen)
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            text, images = content_parts(at, content)
            if images and role != "user":  # as OpenAI answers: only a user shows images, or plays audio
                what = "images are" if images[0].kind == "image" else "audio is"
                raise InvalidRequest(
                    f"Invalid value for '{images[0].param}': {what} taken in user messages only.", images[0].param
                )
            seen.extend(images)
            media.counted(len(seen), f"{at}.content")
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
                media=seen[before:] or None,
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


def generation_prompt(r: ChatRequest) -> bool:
    """Whether the template opens the assistant's turn. `continue_final_message` (vLLM's
    name for what Corral does with a final assistant message anyway) with
    `add_generation_prompt` true is a contradiction: 400, as llama-server answers it."""
    if r.continue_final_message:
        if r.add_generation_prompt:
            raise InvalidRequest(
                "'continue_final_message' and 'add_generation_prompt' cannot both be true.", "continue_final_message"
            )
        if not r.messages or r.messages[-1].get("role") != "assistant":
            raise InvalidRequest("'continue_final_message' needs a final assistant message to continue.", "messages")
        return True  # the final assistant message is continued: rendered after the opened turn
    return r.add_generation_prompt is not False


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


def embedding_inputs(r: EmbeddingRequest) -> list[Prompt]:
    """The inputs to embed: texts, token arrays, or llama-server's mixed and object forms
    (router/generation/prompts.py), any of them in one list as llama-server takes them."""
    if r.dimensions is not None:
        raise Unsupported("dimensions is not supported.", "dimensions")
    if isinstance(r.input, list) and not r.input:
        raise InvalidRequest("'input' must not be empty.", "input")
    inputs = prompt_list(r.input, "input")
    for i, x in enumerate(inputs):
        if not x:  # OpenAI refuses an empty string; llama-server embeds its BOS alone
            raise InvalidRequest(f"'input[{i}]' must not be an empty string.", "input")
    return inputs


def json_schemas(
    response_format: ResponseFormat | None, json_schema: dict[str, Any] | None
) -> list[tuple[dict[str, Any], str]]:
    """The JSON schemas a request asks its output to match, each with its parameter:
    `response_format`'s (`text` asks for nothing; `json_object` for any JSON object, or for
    its `schema` when it has one, as llama-server takes it; `json_schema` for its `schema`,
    any object when that is left out, as for json_object)
    and llama-server's `json_schema`, as is."""
    out: list[tuple[dict[str, Any], str]] = []
    if isinstance(response_format, ResponseFormatJsonObject):
        # llama-server's extension: json_object with a schema is that schema
        # (tools/server/server-common.cpp, the "response_format" field).
        # An empty schema means any object there, as an absent one does.
        schema = response_format.schema
        out.append((schema or ANY_OBJECT, "response_format"))
    elif isinstance(response_format, ResponseFormatJsonSchema):
        schema = response_format.json_schema.schema
        out.append((ANY_OBJECT if schema is None else schema, "response_format"))
    if json_schema is not None:
        out.append((json_schema, "json_schema"))
    return out


# OpenAI's bounds on `metadata` (chat completions and Responses alike): 16 pairs, keys up
# to 64 characters, values up to 512. Corral keeps a Responses request's metadata with the
# stored response, in a store that every key shares: unbounded, one key's metadata could
# push out another key's responses.
METADATA_PAIRS = 16
METADATA_KEY_CHARS = 64
METADATA_VALUE_CHARS = 512


def check_metadata(metadata: dict[str, str] | None) -> None:
    """Refuse metadata past OpenAI's bounds, naming the pair."""
    if metadata is None:
        return
    if len(metadata) > METADATA_PAIRS:
        raise InvalidRequest(
            f"Invalid 'metadata': too many properties. Expected an object with at most {METADATA_PAIRS} "
            f"properties, but got an object with {len(metadata)} properties instead.",
            "metadata",
        )
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS:
            raise InvalidRequest(
                f"Invalid 'metadata': a key is too long. Expected a key of at most {METADATA_KEY_CHARS} "
                f"characters, but got one of {len(key)} characters instead.",
                "metadata",
            )
        if len(value) > METADATA_VALUE_CHARS:
            raise InvalidRequest(
                f"Invalid 'metadata.{key}': string too long. Expected a string with maximum length "
                f"{METADATA_VALUE_CHARS}, but got a string with length {len(value)} instead.",
                f"metadata.{key}",
            )
