"""Anthropic's Messages body, translated into the internal generation request
(router/generation/job.py), as llama-server (tools/server/server-chat.cpp) and Ollama
(middleware/anthropic.go) convert it to the chat form their core serves.

- `system`, a string or text blocks, is the system message. A `system` message among the
  turns (Claude Code sends one after the user's first) joins the turn it follows, as most
  templates refuse a system message that is not first.
- A message's blocks become chat messages: text is the content (a user's blocks joined by
  a blank line); `thinking` is an assistant's reasoning_content; `tool_use` blocks are its
  tool_calls; each `tool_result` is a `tool` message answering its call, before the user's
  own text, as Anthropic orders them. Images (base64 sources) go with the user turn's text as
  media markers (router/generation/media.py); documents need a file store, which
  Corral does not run: a 400 naming the block.
- `tools` (name, description, input_schema) are function tools; `tool_choice` auto / any /
  tool / none is auto / required / that function / none, and `disable_parallel_tool_use`
  is parallel_tool_calls false. Anthropic's server tools (a versioned `type`) are left out
  (served_tools), or refused with [server] hosted_tools = "refuse".
- `thinking` enabled or disabled sets the template's `enable_thinking`.
- `output_format` (or `output_config.format`) with a JSON schema constrains the answer as
  OpenAI's response_format does.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from router.api.anthropic import schemas as s
from router.generation import media
from router.generation import sampling, structured, tool_schemas
from router.generation.job import GenerationJob
from router.generation.tool_schemas import ToolRequest
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import MEDIA_MARKER, ChatMessage, Media, SamplingParams, ToolCall

# Claude Code's first system block is a billing header whose `cch=` stamp changes with
# every request, so no prompt would share a cached prefix past it. llama-server blanks it
# (tools/server/server-chat.cpp, normalize_anthropic_billing_header); so does Corral.
_BILLING = re.compile(r"^(x-anthropic-billing-header:[^\n]*?cch=)([0-9a-zA-Z]+)(;)")


# The job's fields as a Messages request names them, for the errors of one translated for
# an upstream (router/generation/remote/naming.py).
PARAM_NAMES = {"stop": "stop_sequences"}


def system_text(system: str | list[s.TextBlock] | None) -> str | None:
    if system is None:
        return None
    text = system if isinstance(system, str) else "\n\n".join(b.text for b in system)
    return _BILLING.sub(lambda m: m.group(1) + "f" * len(m.group(2)) + m.group(3), text)


def chat_messages(system: str | list[s.TextBlock] | None, messages: list[s.Message]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    text = system_text(system)
    if text is not None:
        out.append(ChatMessage(role="system", content=text))
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message.", "messages")
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if m.role == "system":
            _system_turn(out, _plain(m.content, at))
        elif isinstance(m.content, str):
            out.append(ChatMessage(role=m.role, content=m.content))
        elif m.role == "user":
            out += _user(m.content, at)
        else:
            out.append(_assistant(m.content, at))
    return out


def _plain(content: str | list[s.Block], at: str) -> str:
    """A system message's text: a string, or text blocks."""
    if isinstance(content, str):
        return content
    for j, b in enumerate(content):
        if not isinstance(b, s.TextBlock):
            raise InvalidRequest(f"'{at}.content[{j}]': a system message holds text blocks only.", f"{at}.content[{j}].type")
    return "\n\n".join(b.text for b in content if isinstance(b, s.TextBlock))


def _system_turn(out: list[ChatMessage], text: str) -> None:
    """A system message among the turns. Most chat templates refuse a system message that
    is not first (Qwen3's, Gemma's raise), so one that follows the opening system prompt
    joins it, and one later in the conversation joins the user's turn it follows (or is
    a user turn of its own after the assistant's): its words reach the model where they
    were said, in a shape every template renders."""
    if all(m.role == "system" for m in out):
        if out:
            out[-1] = ChatMessage(role="system", content=out[-1].content + "\n\n" + text)
        else:
            out.append(ChatMessage(role="system", content=text))
    elif out[-1].role == "user":  # its images stay with it
        out[-1] = msgspec.structs.replace(out[-1], content=out[-1].content + "\n\n" + text)
    else:
        out.append(ChatMessage(role="user", content=text))


def _refuse_media(block: s.Block, at: str, where: str = "here") -> None:
    if isinstance(block, s.DocumentBlock):
        raise Unsupported(f"'{at}': documents are not supported.", at)
    if isinstance(block, s.ImageBlock):
        raise Unsupported(f"'{at}': images are taken in a user message's content only, not {where}.", at)


def image(block: s.ImageBlock, at: str) -> Media:
    """An image block's bytes: a `base64` source, or a `url` one (fetched only from the
    hosts the operator lists); a `file` source needs a file store, which Corral has not."""
    src = block.source
    if not isinstance(src, dict):
        raise InvalidRequest(f"Missing required parameter: '{at}.source'.", f"{at}.source")
    kind = src.get("type")
    if kind == "url":  # fetched from the operator's hosts only (router/generation/image_urls.py)
        url = src.get("url")
        if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")):
            raise InvalidRequest(f"Invalid value for '{at}.source.url': expected an http(s) URL.", f"{at}.source.url")
        return media.from_url(url, f"{at}.source.url")
    if kind != "base64":
        raise InvalidRequest(f"Invalid value for '{at}.source.type': expected 'base64'.", f"{at}.source.type")
    mime = src.get("media_type")
    if mime not in media.IMAGE_TYPES:
        raise InvalidRequest(
            f"Invalid value for '{at}.source.media_type': expected one of image/jpeg, image/png, image/gif, image/webp.",
            f"{at}.source.media_type",
        )
    out = media.from_base64(src.get("data"), f"{at}.source.data")
    actual = media.mime_of(out.data)
    if actual != ("image/jpeg" if mime == "image/jpg" else mime):  # as Anthropic checks it
        raise InvalidRequest(
            f"Invalid value for '{at}.source.media_type': the image's data is {actual}, not {mime}.",
            f"{at}.source.media_type",
        )
    return out


def _user(blocks: list[s.Block], at: str) -> list[ChatMessage]:
    """A user turn: its tool results, each a `tool` message, then its text."""
    if not blocks:
        raise InvalidRequest(f"'{at}.content' must not be empty.", f"{at}.content")
    results: list[ChatMessage] = []
    texts: list[str] = []
    images: list[Media] = []
    for j, b in enumerate(blocks):
        bat = f"{at}.content[{j}]"
        if isinstance(b, s.ImageBlock):
            images.append(image(b, bat))
            media.counted(len(images), bat)
            texts.append(MEDIA_MARKER)
            continue
        _refuse_media(b, bat)
        if isinstance(b, s.TextBlock):
            texts.append(b.text)
        elif isinstance(b, s.ToolResultBlock):
            text, shown = _result(b, bat)
            results.append(ChatMessage(role="tool", content=text, tool_call_id=b.tool_use_id, media=shown or None))
        elif not isinstance(b, (s.ThinkingBlock, s.RedactedThinkingBlock)):  # ToolUseBlock
            raise InvalidRequest(f"'{bat}': a tool_use block belongs in an assistant message.", f"{bat}.type")
    if texts:
        results.append(ChatMessage(role="user", content="\n\n".join(texts), media=images or None))
    return results


def _result(b: s.ToolResultBlock, at: str) -> tuple[str, list[Media]]:
    """A tool result's text, with a media marker for each image block (a screenshot a
    tool took, as Claude Code sends them), and the images."""
    images: list[Media] = []
    if b.content is None or isinstance(b.content, str):
        text = b.content or ""
    else:
        texts = []
        for k, part in enumerate(b.content):
            if isinstance(part, s.ImageBlock):
                images.append(image(part, f"{at}.content[{k}]"))
                media.counted(len(images), f"{at}.content[{k}]")
                texts.append(MEDIA_MARKER)
                continue
            _refuse_media(part, f"{at}.content[{k}]", "in a tool result")
            texts.append(part.text if isinstance(part, s.TextBlock) else "")
        text = "\n\n".join(t for t in texts if t)
    # The template has no field for a failed call: the model reads it in the text.
    return (f"Error: {text}" if b.is_error and not text.lower().startswith("error") else text), images


def _assistant(blocks: list[s.Block], at: str) -> ChatMessage:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for j, b in enumerate(blocks):
        bat = f"{at}.content[{j}]"
        _refuse_media(b, bat, "in an assistant message")
        if isinstance(b, s.TextBlock):
            texts.append(b.text)
        elif isinstance(b, s.ThinkingBlock):
            reasoning.append(b.thinking)
        elif isinstance(b, s.ToolUseBlock):
            calls.append(ToolCall(id=b.id, name=b.name, arguments=json.dumps(b.input, ensure_ascii=False)))
        elif isinstance(b, s.ToolResultBlock):
            raise InvalidRequest(f"'{bat}': a tool_result block belongs in a user message.", f"{bat}.type")
        # redacted_thinking: encrypted by Anthropic, nothing a local model can read
    return ChatMessage(
        role="assistant",
        content="".join(texts),
        tool_calls=calls or None,
        reasoning_content="".join(reasoning) if reasoning else None,
    )


def _openai_param(param: str | None) -> str | None:
    """A tools check's parameter (OpenAI's layout) in Anthropic's."""
    if param is None:
        return None
    return param.replace(".function.parameters", ".input_schema").replace(".function.", ".")


def served_tools(raw: list[s.Tool] | None) -> tuple[list[s.Tool] | None, list[str]]:
    """`raw` without Anthropic's server and Anthropic-defined tools (router/api/hosted_tools.py),
    and their types, in order."""
    if not raw:
        return raw, []
    return [t for t in raw if t.type in (None, "custom")], [t.type for t in raw if t.type not in (None, "custom")]


def tools(raw: list[s.Tool] | None, choice: s.ToolChoice | None) -> ToolRequest:
    """The request's tools and tool_choice, checked as OpenAI's are (names, schemas), with
    Anthropic's names in a 400."""
    functions: list[dict[str, Any]] = []
    for i, t in enumerate(raw or ()):
        if t.type not in (None, "custom"):
            raise Unsupported(
                f"'tools[{i}]': {t.type!r} is one of Anthropic's server tools, which run at Anthropic; "
                "Corral serves client tools (name, description, input_schema). This server refuses "
                '(hosted_tools = "refuse") where by default it would leave the tool out.',
                f"tools[{i}].type",
            )
        # OpenAI's key order: a template that renders a tool as JSON writes the same text
        # whichever dialect the tool came in.
        f: dict[str, Any] = {"name": t.name}
        if t.description is not None:
            f["description"] = t.description
        f["parameters"] = t.input_schema or {"type": "object", "properties": {}}
        functions.append({"type": "function", "function": f})
    openai_choice: Any = None
    parallel = True
    if choice is not None:
        parallel = not choice.disable_parallel_tool_use
        if choice.type == "tool":
            if not choice.name:
                raise InvalidRequest("Missing required parameter: 'tool_choice.name' (with type \"tool\").", "tool_choice.name")
            openai_choice = {"type": "function", "function": {"name": choice.name}}
        else:
            openai_choice = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    try:
        return tool_schemas.tool_request(functions or None, openai_choice, parallel, longest_name=128)
    except InvalidRequest as exc:
        param = _openai_param(exc.param)
        text = exc.message.replace(exc.param or "\0", param or "").replace("'tool_choice'", "'tool_choice.name'")
        raise InvalidRequest(text, "tool_choice.name" if param == "tool_choice" else param) from None


def thinking_kwargs(t: s.Thinking | None) -> dict[str, Any] | None:
    """The template's switch: `enable_thinking`, which Qwen3's and other reasoning
    templates read (others ignore it). Adaptive and between_tools leave the template's default."""
    if t is None or t.type in ("adaptive", "between_tools"):
        return None
    if t.type == "enabled" and t.budget_tokens is not None and t.budget_tokens < 1:
        raise InvalidRequest(
            f"Invalid 'thinking.budget_tokens': expected a value >= 1, got {t.budget_tokens}.", "thinking.budget_tokens"
        )
    return {"enable_thinking": t.type == "enabled"}


def _output_schema(r: s.MessagesRequest) -> list[tuple[dict[str, Any], str]]:
    for fmt, param in ((r.output_format, "output_format"), ((r.output_config or {}).get("format"), "output_config.format")):
        if fmt is None:
            continue
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise InvalidRequest(
                f"Invalid '{param}': expected {{\"type\": \"json_schema\", \"schema\": {{...}}}}.", param
            )
        return [(fmt["schema"], param)]
    return []


# Anthropic's own ranges, narrower than the worker's.
_RANGES = {"temperature": (0.0, 1.0), "top_p": (0.0, 1.0)}


def sampling_params(r: s.MessagesRequest, defaults: SamplingParams) -> SamplingParams:
    for name, (lo, hi) in _RANGES.items():
        value = getattr(r, name)
        if value is not None and not lo <= value <= hi:  # NaN fails this too
            raise InvalidRequest(f"Invalid '{name}': expected a value between {lo:g} and {hi:g}, got {value:g}.", name)
    d = defaults
    stops = d.stop if r.stop_sequences is None else list(r.stop_sequences)
    params = SamplingParams(
        max_tokens=r.max_tokens,
        temperature=d.temperature if r.temperature is None else r.temperature,
        top_p=d.top_p if r.top_p is None else r.top_p,
        top_k=d.top_k if r.top_k is None else r.top_k,
        min_p=d.min_p,
        seed=d.seed,
        repeat_penalty=d.repeat_penalty,
        repeat_last_n=d.repeat_last_n,
        presence_penalty=d.presence_penalty,
        frequency_penalty=d.frequency_penalty,
        stop=stops,
    )
    sampling.check(params)
    sampling.check_stops(stops, "stop_sequences")
    constraint = structured.constraint(_output_schema(r))
    if constraint is not None:
        params = msgspec.structs.replace(params, constraint=constraint)
    return params


def messages_job(r: s.MessagesRequest, model: str, defaults: SamplingParams) -> GenerationJob:
    return GenerationJob(
        model=model,
        params=sampling_params(r, defaults),
        messages=tuple(chat_messages(r.system, r.messages)),
        stream=r.stream,
        tools=tools(r.tools, r.tool_choice),
        template_kwargs=thinking_kwargs(r.thinking),
    )
