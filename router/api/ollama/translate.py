"""Ollama's chat and generate bodies, translated into the internal generation request
(router/generation/job.py).

Ollama's `options` carry the sampling parameters under llama.cpp's names; `format` asks
for JSON ("json") or JSON matching a schema; `think: false` turns a reasoning template's
thinking off; `keep_alive` is how long the model stays loaded once idle. /api/generate
renders its prompt with the model's chat template (system, then the prompt as the user's
turn) unless `raw` asks for the text as it is.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from router.api.ollama.schemas import OllamaChatRequest, OllamaGenerateRequest, KeepAliveValue, OllamaOptions
from router.generation import media, sampling, structured, tool_schemas
from router.generation.job import GenerationJob, KeepAlive
from router.generation.structured import ANY_OBJECT
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import MEDIA_MARKER, ChatMessage, Media, SamplingParams, ToolCall

_ROLES = ("system", "user", "assistant", "tool")
# Go's time.ParseDuration: a sequence of decimal numbers, each with a unit.
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
# SamplingParams' fields under Ollama's names, for a 400 that names the option.
_OPTION = {"max_tokens": "num_predict"}


def _option(field: str) -> str:
    """A sampling field as the Ollama option that sets it."""
    return "options." + _OPTION.get(field, field)


# The job's fields as an Ollama request names them, for the errors of one translated for
# an upstream (router/generation/remote/naming.py).
PARAM_NAMES = {
    **{
        f: _option(f)
        for f in ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                  "presence_penalty", "frequency_penalty", "seed", "stop")
    },
    "reasoning_effort": "think",
}


def keep_alive(value: KeepAliveValue) -> KeepAlive:
    """`keep_alive` as seconds (< 0: for ever); absent: the config's idle_timeout, as
    Ollama's own default applies when a request names none."""
    if value is None:
        return KeepAlive(None)
    if isinstance(value, (int, float)):
        return KeepAlive(float(value))
    text = value.strip()
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    if body == "0":
        return KeepAlive(0.0)
    seconds, at = 0.0, 0
    for m in _DURATION.finditer(body):
        if m.start() != at:
            break
        seconds += float(m.group(1)) * _UNITS[m.group(2)]
        at = m.end()
    if not body or at != len(body):
        raise InvalidRequest(
            f"Invalid 'keep_alive': {value!r} is not a duration (a number of seconds, -1 for ever, "
            'or a string with units such as "5m", "1h30m" or "-1m").',
            "keep_alive",
        )
    return KeepAlive(sign * seconds)


def sampling_params(o: OllamaOptions | None, defaults: SamplingParams) -> SamplingParams:
    """The worker's sampling parameters from `options`; what a request leaves unset takes
    the model's `defaults` (its config's over llama-server's, which Ollama's match). The
    runner's own options (num_ctx, num_gpu, ...) are the config's to set: accepted and
    left alone."""
    o = o or OllamaOptions()
    d = defaults
    if o.typical_p not in (None, 1.0):
        raise Unsupported("'options.typical_p' is not supported (only its default, 1.0).", "options.typical_p")
    if o.mirostat not in (None, 0):
        raise Unsupported("'options.mirostat' is not supported (only 0, off).", "options.mirostat")
    if o.num_predict is None:
        max_tokens = d.max_tokens
    elif o.num_predict in (-1, -2):  # no limit; until the context is full (the same here)
        max_tokens = None
    elif o.num_predict < -2:
        raise InvalidRequest(
            f"Invalid 'options.num_predict': expected -1, -2 or a value >= 0, got {o.num_predict}.",
            "options.num_predict",
        )
    else:
        max_tokens = o.num_predict
    stops = d.stop if o.stop is None else list(o.stop)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=d.temperature if o.temperature is None else o.temperature,
        top_p=d.top_p if o.top_p is None else o.top_p,
        top_k=d.top_k if o.top_k is None else o.top_k,
        min_p=d.min_p if o.min_p is None else o.min_p,
        seed=d.seed if o.seed is None else None if o.seed == -1 else o.seed,  # -1: random, as Ollama
        repeat_penalty=d.repeat_penalty if o.repeat_penalty is None else o.repeat_penalty,
        repeat_last_n=d.repeat_last_n if o.repeat_last_n is None else o.repeat_last_n,
        presence_penalty=d.presence_penalty if o.presence_penalty is None else o.presence_penalty,
        frequency_penalty=d.frequency_penalty if o.frequency_penalty is None else o.frequency_penalty,
        stop=stops,
    )
    sampling.check(params, _option, min_tokens=0)
    sampling.check_stops(stops, "options.stop")
    return params


def _constraint(params: SamplingParams, fmt: str | dict[str, Any] | None) -> SamplingParams:
    """`format`: "json" is any JSON object (llama.cpp's json.gbnf, which Ollama uses);
    an object is a JSON schema; "" or absent asks for nothing."""
    if fmt is None or fmt == "":
        return params
    if isinstance(fmt, str) and fmt != "json":
        raise InvalidRequest(
            f"Invalid 'format': {fmt!r}; expected \"json\" or a JSON schema object.", "format"
        )
    schema = ANY_OBJECT if isinstance(fmt, str) else fmt
    c = structured.constraint([(schema, "format")])
    return params if c is None else msgspec.structs.replace(params, constraint=c)


def _effort(think: bool | str | None) -> str | None:
    """`think` as a reasoning effort, for an upstream that takes one: true is "medium",
    "max" OpenAI's "xhigh", false "none"."""
    if think is None:
        return None
    if isinstance(think, bool):
        return "medium" if think else "none"
    return "xhigh" if think == "max" else think


def _think(think: bool | str | None) -> dict[str, Any] | None:
    """`think: false` turns a reasoning template's thinking off; true and the effort
    levels ("low", "medium", "high") leave it on, as templates take no effort."""
    if think is None or think is True:
        return None
    if think is False:
        return {"enable_thinking": False}
    if think not in ("low", "medium", "high", "max"):
        raise InvalidRequest(
            f"Invalid 'think': {think!r}; expected true, false, \"low\", \"medium\", \"high\" or \"max\".", "think"
        )
    return None


def messages(raw: list[dict[str, Any]]) -> list[ChatMessage]:
    """Ollama's messages: role, content, thinking, tool_calls (arguments as an object),
    tool_name on a tool's answer, images (base64, placed as `with_images` says)."""
    out: list[ChatMessage] = []
    seen = 0
    for i, m in enumerate(raw):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise InvalidRequest(f"Invalid type for '{at}': expected an object.", at)
        role = m.get("role")
        if not isinstance(role, str) or role.lower() not in _ROLES:
            raise InvalidRequest(f"Invalid value for '{at}.role': expected one of {list(_ROLES)}.", f"{at}.role")
        if m.get("images") and role.lower() != "user":
            raise InvalidRequest(f"Invalid value for '{at}.images': images are taken in user messages only.", f"{at}.images")
        content, images = with_images(_string(m, "content", at) or "", m.get("images"), f"{at}.images")
        seen += len(images)
        media.counted(seen, f"{at}.images")
        out.append(
            ChatMessage(
                role=role.lower(),
                content=content,
                media=images or None,
                name=_string(m, "tool_name", at),
                tool_calls=_calls(m.get("tool_calls"), at, i),
                tool_call_id=_string(m, "tool_call_id", at),
                reasoning_content=_string(m, "thinking", at),
            )
        )
    return out


def with_images(content: str, images: Any, param: str) -> tuple[str, list[Media]]:
    """A text and its `images` (base64 strings), each where an "[img]" of the text stands,
    else before the text, as Ollama places them (server/prompt.go, chatPrompt)."""
    if not images:
        return content, []
    if not isinstance(images, list):
        raise InvalidRequest(f"Invalid type for '{param}': expected an array of base64 strings.", param)
    out = [media.from_base64(img, f"{param}[{k}]") for k, img in enumerate(images)]
    # The first images take the "[img]"s in order; those left over go before the text, so
    # in the text's order (the markers') they come first.
    placed = min(content.count("[img]"), len(out))
    content = content.replace("[img]", MEDIA_MARKER, placed)
    return MEDIA_MARKER * (len(out) - placed) + content, out[placed:] + out[:placed]


def _string(m: dict[str, Any], key: str, at: str) -> str | None:
    v = m.get(key)
    if v is not None and not isinstance(v, str):
        raise InvalidRequest(f"Invalid type for '{at}.{key}': expected a string.", f"{at}.{key}")
    return v


def _calls(calls: Any, at: str, i: int) -> list[ToolCall] | None:
    if not calls:
        return None
    if not isinstance(calls, list):
        raise InvalidRequest(f"Invalid type for '{at}.tool_calls': expected an array.", f"{at}.tool_calls")
    out = []
    for j, c in enumerate(calls):
        cat = f"{at}.tool_calls[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise InvalidRequest(f"Missing required parameter: '{cat}.function.name'.", f"{cat}.function.name")
        args = f.get("arguments", {})
        if not isinstance(args, (dict, str)):
            raise InvalidRequest(
                f"Invalid type for '{cat}.function.arguments': expected an object.", f"{cat}.function.arguments"
            )
        # Ollama's calls carry no id (its Python client drops them); templates that
        # render ids get one that names the message and the call.
        call_id = c.get("id") if isinstance(c.get("id"), str) else f"call_{i}_{j}"
        out.append(ToolCall(id=call_id, name=f["name"], arguments=args if isinstance(args, str) else json.dumps(args)))
    return out


def chat_job(r: OllamaChatRequest, model: str, defaults: SamplingParams) -> GenerationJob:
    params = _constraint(sampling_params(r.options, defaults), r.format)
    return GenerationJob(
        model=model,
        params=params,
        messages=tuple(messages(r.messages or [])),
        stream=r.stream is not False,
        # Ollama's client sends `tools: []` with every chat: no tools.
        tools=tool_schemas.tool_request(r.tools or None, None, None),
        template_kwargs=_think(r.think),
        keep_alive=keep_alive(r.keep_alive),
        effort=_effort(r.think),
    )


def generate_job(r: OllamaGenerateRequest, model: str, defaults: SamplingParams) -> GenerationJob:
    """A prompt in the model's template (system, then the user's turn), or `raw` text."""
    for name, value, why in (
        ("suffix", r.suffix, "fill-in-the-middle is not supported"),
        ("template", r.template, "Corral renders with the model's own chat template (or its config's)"),
        ("context", r.context, "send the conversation as /api/chat messages instead"),
    ):
        if value:
            raise Unsupported(f"'{name}' is not supported: {why}.", name)
    prompt, images = with_images(r.prompt or "", r.images, "images")
    media.counted(len(images), "images")
    params = _constraint(sampling_params(r.options, defaults), r.format)
    stream, kept = r.stream is not False, keep_alive(r.keep_alive)
    if r.raw:
        if r.system:
            raise InvalidRequest("raw mode does not support template, system, or context", "system")
        return GenerationJob(
            model=model, params=params, prompt=prompt, stream=stream, keep_alive=kept, media=tuple(images)
        )
    turns = ([ChatMessage(role="system", content=r.system)] if r.system else []) + [
        ChatMessage(role="user", content=prompt, media=images or None)
    ]
    return GenerationJob(
        model=model, params=params, messages=tuple(turns), template_kwargs=_think(r.think), effort=_effort(r.think),
        stream=stream,
        keep_alive=kept,
    )
