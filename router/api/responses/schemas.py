"""OpenAI's Responses API request body (POST /v1/responses), as the openai SDK and the
agents that use it (Codex CLI, the OpenAI Agents SDK) send it.

`input` items and `tools` are many shapes told apart by `type` (a message may leave it
out), so they are decoded as objects and checked item by item
(router/api/responses/items.py), each failure naming its path (`input[3].call_id`). Keys
Corral does not act on are accepted and ignored, as llama-server takes them: Codex sends
`include`, `prompt_cache_key` and `client_metadata`, and each release adds more. A known
key of the wrong type is still a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec

from router.server.cache_scope import Salt

Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]


class TextFormat(msgspec.Struct):
    """`text.format`: free text, any JSON object, or JSON matching `schema`."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    # The field is `schema` on the wire; msgspec's own Struct has no such attribute to clash.
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class TextOptions(msgspec.Struct):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted and ignored


class Reasoning(msgspec.Struct):
    # "none" turns a reasoning template's thinking off; the others leave it on.
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # accepted and ignored
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # its older name


class ResponsesRequest(msgspec.Struct):
    model: str | None = None  # None: the server's default_model
    input: Union[str, list[Any], None] = None
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    max_output_tokens: Int32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: Int32 | None = None  # only 0: logprobs are not served here
    reasoning: Reasoning | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    stream: bool = False
    previous_response_id: str | None = None
    # Refused when set: they need what Corral does not keep (background jobs,
    # conversations, reusable prompts).
    background: bool | None = None
    conversation: Union[str, dict[str, Any], None] = None
    prompt: dict[str, Any] | None = None
    # Accepted and ignored: Corral truncates nothing and never runs more than asked.
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: Int32 | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # vLLM's: requests with different salts share no cached prefix, even under one key
    # (router/server/cache_scope.py).
    cache_salt: Salt | None = None
    service_tier: str | None = None
    include: list[str] | None = None
