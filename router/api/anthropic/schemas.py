"""Anthropic's Messages API request bodies (POST /v1/messages, /v1/messages/count_tokens),
as Anthropic's API reference and its SDKs send them.

Content blocks are told apart by `type`, so that a block of a type Corral does not know is a
400 naming its path (`messages[1].content[0].type`). Keys Corral does not act on are
accepted and ignored, as llama-server and Ollama take this API: Claude Code sends fields
that its `anthropic-beta` header turns on (`context_management`, `output_config`, each
block's `cache_control`), and a new client release adds more. A known key of the wrong type
is still a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec

# Bounded at decode time: the worker's frames hold at most 64 bits, and a huge JSON
# integer must be a 400 naming its parameter, not a 500.
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]


class TextBlock(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class ImageBlock(msgspec.Struct, tag="image", tag_field="type"):
    source: dict[str, Any] | None = None


class DocumentBlock(msgspec.Struct, tag="document", tag_field="type"):
    source: dict[str, Any] | None = None


class ToolUseBlock(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any] = {}


class ToolResultBlock(msgspec.Struct, tag="tool_result", tag_field="type"):
    tool_use_id: str
    # A string, or blocks (text; an image refused).
    content: Union[str, list[Union[TextBlock, ImageBlock, DocumentBlock]], None] = None
    is_error: bool = False


class ThinkingBlock(msgspec.Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str | None = None  # Anthropic's; Corral's own are empty and nothing checks them


class RedactedThinkingBlock(msgspec.Struct, tag="redacted_thinking", tag_field="type"):
    data: str = ""


Block = Union[TextBlock, ImageBlock, DocumentBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock, RedactedThinkingBlock]


class Message(msgspec.Struct):
    # "system" past the first turn: Claude Code's mid-conversation system messages (its
    # mid-conversation-system beta), which carry instructions where they apply.
    role: Literal["user", "assistant", "system"]
    content: Union[str, list[Block]]


class Tool(msgspec.Struct):
    """A client tool. Anthropic's server tools (web search, code execution, ...) carry a
    versioned `type` and no `input_schema`: they run at Anthropic, and Corral leaves them
    out, or refuses them naming the tool (router/api/hosted_tools.py)."""

    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None  # "custom", or absent, for a client tool


class ToolChoice(msgspec.Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # with "tool": the tool the model must call
    disable_parallel_tool_use: bool = False


class Thinking(msgspec.Struct):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: Int32 | None = None  # accepted; a template has no budget to set


class MessagesRequest(msgspec.Struct):
    messages: list[Message]
    max_tokens: Int32
    model: str | None = None  # None: the server's default_model
    system: Union[str, list[TextBlock], None] = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int32 | None = None
    stream: bool = False
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    metadata: dict[str, Any] | None = None  # accepted and ignored (its user_id)
    # Structured output: {"type": "json_schema", "schema": {...}}, at the top level
    # (the structured-outputs beta) or under output_config (its later home).
    output_format: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


class CountTokensRequest(msgspec.Struct):
    """/v1/messages/count_tokens: the fields that shape the prompt."""

    messages: list[Message]
    model: str | None = None
    system: Union[str, list[TextBlock], None] = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class AnthropicErrorDetail(msgspec.Struct):
    type: str
    message: str


class AnthropicErrorBody(msgspec.Struct):
    """Anthropic's error: `{"type": "error", "error": {"type", "message"}}`."""

    type: Literal["error"]
    error: AnthropicErrorDetail
