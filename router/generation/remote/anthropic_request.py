"""The internal request as an Anthropic Messages request, for an upstream that speaks
only Anthropic's API (api.anthropic.com, or a gateway in front of it).

As for an OpenAI-compatible upstream (outbound.py), only what the client set is sent:
Anthropic's defaults are its own. Its API differs in shape, and the translation follows
what LiteLLM's router does with an OpenAI request for Claude:

- System (and developer) messages, wherever they stand, go into the top-level `system`.
- An assistant's tool calls become `tool_use` blocks; tool results become `tool_result`
  blocks of a user turn; consecutive turns of one role are one turn (Anthropic's API
  asks that a tool result open the user turn after its call).
- `max_tokens` is required there: the client's, else DEFAULT_MAX_TOKENS (LiteLLM's).
- A forced tool is `tool_choice: {type: tool}`, "required" is `{type: any}`, "none" is
  `{type: none}` with the tools, and parallel_tool_calls false is
  `disable_parallel_tool_use`.
- A JSON schema goes as `output_config.format` (structured outputs).
- A reasoning effort (OpenAI's reasoning_effort, Responses' reasoning.effort, Ollama's
  think) turns extended thinking on with a budget by effort (THINKING_BUDGETS).

What the API has no counterpart for is a 400 here, naming the parameter, rather than a
request that silently means less: penalties and min_p other than their neutral values,
seed, n > 1, JSON mode without a schema, grammars, template kwargs, text prompts.

Pure: no I/O, tested without an upstream.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from router.generation import media
from router.generation.job import GenerationJob
from router.generation.remote.outbound import answered_ids, sent_set
from router.generation.structured import json_mode
from router.generation.tool_schemas import ToolRequest
from router.server import json_text
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import ChatMessage

# The Messages API requires max_tokens; a client of another dialect may not send it.
DEFAULT_MAX_TOKENS = 4096
# Sampling fields the Messages API lacks, with the value at which each does nothing (sent
# at that value, it is dropped; at any other, it is a 400). No value of seed is neutral.
_NEUTRAL: dict[str, object] = {
    "min_p": 0.0, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "ignore_eos": False,
}
_WHY = "Anthropic's Messages API has no such parameter"
# A reasoning effort as extended thinking's token budget (LiteLLM's for low, medium and
# high; the API's least, 1024, for minimal).
THINKING_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 2048, "high": 4096, "xhigh": 8192}


def messages_body(job: GenerationJob, model: str) -> dict[str, Any]:
    """The streamed Messages request for a chat job."""
    body = conversation_body(job, model)
    body.update(_sampling(job))
    if job.effort not in (None, "none"):
        body.update(_thinking(job, body["max_tokens"]))
    if job.template_kwargs and job.template_kwargs != {"enable_thinking": False}:  # off is Anthropic's default
        raise Unsupported(
            "'chat_template_kwargs' cannot be sent to this model's upstream: Anthropic's Messages API has "
            "no chat template (its `thinking` is reached through its own route, /v1/messages).",
            "chat_template_kwargs",
        )
    body["stream"] = True
    return body


def conversation_body(job: GenerationJob, model: str) -> dict[str, Any]:
    """What a Messages request says of the prompt (model, system, messages, tools and
    tool_choice): the whole of a count_tokens request."""
    turns = job.messages
    if turns is None:
        raise Unsupported(
            "Only a chat can be sent to this model's upstream, which speaks Anthropic's Messages API: "
            "it has no text completion.", "prompt",
        )
    system, messages = _conversation(turns)
    body: dict[str, Any] = {"model": model, "messages": messages}
    if system:
        body["system"] = system
    body.update(_tools(job.tools, turns))
    return body


def _tools(tools: ToolRequest, turns: tuple[ChatMessage, ...]) -> dict[str, Any]:
    if not tools.offered:
        # tool_choice "none": the tools with Anthropic's "none", as that API refuses a
        # conversation with tool_use blocks and no tools; one with calls and no tools at
        # all (OpenAI's API takes it) gets the called tools, described by name only.
        withheld = [_tool(t) for t in tools.withheld or ()] or _called(turns)
        return {"tools": withheld, "tool_choice": {"type": "none"}} if withheld else {}
    out: dict[str, Any] = {"tools": [_tool(t) for t in tools.offered]}
    choice: dict[str, Any] | None = None
    if tools.forced is not None:
        choice = {"type": "tool", "name": tools.forced[0]["function"]["name"]} if len(tools.forced) == 1 else {"type": "any"}
    if not tools.parallel:
        choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    if choice is not None:
        out["tool_choice"] = choice
    return out


def _thinking(job: GenerationJob, max_tokens: int) -> dict[str, Any]:
    """Anthropic's extended thinking for a reasoning effort. Its budget counts within
    max_tokens and must stay below it: a client that set no max_tokens gets the default
    on top of the budget; one whose max_tokens leaves no room is refused, naming it. What
    that API refuses beside thinking is refused here first, naming the parameter: a
    forced tool, a temperature other than 1, top_k, a top_p below 0.95."""
    budget = THINKING_BUDGETS.get(job.effort or "")
    if budget is None:
        raise InvalidRequest(
            f"Invalid 'reasoning_effort': {job.effort!r}; expected one of none, {', '.join(THINKING_BUDGETS)}.",
            "reasoning_effort",
        )
    sent, p = sent_set(job), job.params
    for param, refused in (
        ("tool_choice", job.tools.forced is not None),
        ("temperature", "temperature" in sent and p.temperature != 1.0),
        ("top_k", "top_k" in sent),
        ("top_p", "top_p" in sent and p.top_p < 0.95),
    ):
        if refused:
            raise Unsupported(
                f"'{param}' cannot be sent to this model's upstream with a reasoning effort: Anthropic's extended "
                "thinking allows no forced tool, temperature 1 only, no top_k and a top_p of 0.95 or more.", param,
            )
    if "max_tokens" not in sent or p.max_tokens is None:
        max_tokens = budget + DEFAULT_MAX_TOKENS
    elif max_tokens <= budget:
        raise Unsupported(
            f"'max_tokens' must be above {budget} for reasoning effort {job.effort!r} on this model's upstream: "
            "Anthropic's extended thinking spends that many tokens within max_tokens.", "max_tokens",
        )
    return {"max_tokens": max_tokens, "thinking": {"type": "enabled", "budget_tokens": budget}}


def _sampling(job: GenerationJob) -> dict[str, Any]:
    p, sent = job.params, sent_set(job)
    out: dict[str, Any] = {
        "max_tokens": p.max_tokens if "max_tokens" in sent and p.max_tokens is not None else DEFAULT_MAX_TOKENS
    }
    for field in ("temperature", "top_p", "top_k"):
        if field in sent:
            out[field] = getattr(p, field)
    if "stop" in sent and p.stop:
        out["stop_sequences"] = list(p.stop)
    for field, neutral in _NEUTRAL.items():
        if field in sent and getattr(p, field) != neutral:
            raise Unsupported(f"'{field}' cannot be sent to this model's upstream: {_WHY}.", field)
    if "seed" in sent and p.seed is not None:
        raise Unsupported(f"'seed' cannot be sent to this model's upstream: {_WHY}.", "seed")
    if job.n != 1:
        raise Unsupported(f"'n' cannot be sent to this model's upstream: {_WHY} (one answer a request).", "n")
    if job.lora is not None:
        raise Unsupported(f"'lora' cannot be sent to this model's upstream: {_WHY}.", "lora")
    c = p.constraint
    if c is not None:
        if json_mode(c):
            raise Unsupported(
                f"'{c.param}': JSON mode without a schema cannot be sent to this model's upstream: Anthropic's "
                "Messages API constrains output by a JSON schema only (give one).", c.param,
            )
        if c.kind != "json_schema":
            raise Unsupported(f"'{c.param}': a grammar cannot be sent to this model's upstream: {_WHY}.", c.param)
        out["output_config"] = {"format": {"type": "json_schema", "schema": json.loads(c.given or c.source)}}
    return out


def _conversation(turns: tuple[ChatMessage, ...]) -> tuple[str, list[dict[str, Any]]]:
    """The system text, and the turns as Anthropic's messages, each turn's content blocks
    merged with the turn before when both are of one role."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for i, m in enumerate(answered_ids(turns)):
        if m.role in ("system", "developer"):
            if m.content:
                system.append(m.content)
            continue
        role, blocks = _blocks(i, m)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return "\n\n".join(system), out


def _blocks(i: int, m: ChatMessage) -> tuple[str, list[dict[str, Any]]]:
    if m.role == "tool":
        return "user", [{"type": "tool_result", "tool_use_id": m.tool_call_id or "", "content": m.content}]
    if m.role == "assistant":
        blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
        for j, c in enumerate(m.tool_calls or ()):
            blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": _input(i, j, c.arguments)})
        return "assistant", blocks
    if m.media:  # text and image blocks, in the order the client sent them
        if (sound := next((p for p in m.media if p.kind == "audio"), None)) is not None:
            raise Unsupported(f"This model's upstream speaks Anthropic's Messages API, which takes no audio ({sound.param}).", sound.param)
        return "user", [
            {"type": "text", "text": p} if isinstance(p, str) else {
                "type": "image", "source": {"type": "base64", "media_type": media.mime_of(p.data),
                                            "data": base64.b64encode(p.data).decode()},
            }
            for p in media.pieces(m.content, m.media)
        ]
    # An empty text block is refused there; an empty user message says nothing.
    return "user", [{"type": "text", "text": m.content}] if m.content else []


def _input(i: int, j: int, arguments: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's `input` is."""
    try:
        value = json_text.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        at = f"messages[{i}].tool_calls[{j}].function.arguments"
        raise InvalidRequest(
            f"Invalid '{at}': Anthropic's Messages API takes a call's arguments as a JSON object.", at
        )
    return value


def _called(turns: tuple[ChatMessage, ...]) -> list[dict[str, Any]]:
    names = dict.fromkeys(c.name for m in turns if m.role == "assistant" for c in m.tool_calls or ())
    return [{"name": n, "input_schema": {"type": "object"}} for n in names]


def _tool(t: dict[str, Any]) -> dict[str, Any]:
    f = t["function"]
    out: dict[str, Any] = {"name": f["name"], "input_schema": f.get("parameters") or {"type": "object"}}
    if f.get("description"):
        out["description"] = f["description"]
    if f.get("strict") is True:
        out["strict"] = True
    return out
