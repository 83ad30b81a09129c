"""How a model writes tool calls and reasoning, decided from its chat template.

Pure and free of llama_cpp: the worker decides a model's format when it loads, reports it
in Ready, and the router parses output by it (router/generation/tool_calls.py, router/generation/reasoning.py).

The formats are llama.cpp's (common/chat.cpp) for the families that matter most:
- hermes: Hermes, Qwen 2.5 and Qwen 3 write `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
- llama3: Llama 3.1-3.3 write a bare JSON object `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>`.
- mistral: Mistral Nemo and later write `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`.
- generic: any other template. The template never sees the tools: a system message
  describes them and asks for a JSON reply, `{"tool_calls": [{"name", "arguments"}]}` to
  call tools or `{"response": "..."}` to answer, and the tool turns of the history are
  rewritten as plain user and assistant messages, so a template that knows nothing of
  tools (gemma's) still renders the conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from worker.protocol import ChatMessage, ToolFormat

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
LLAMA3_PYTHON_TAG = "<|python_tag|>"
MISTRAL_PREFIX = "[TOOL_CALLS]"

# Text the worker must render even where it is a special token, because the router parses
# by it (llama-server's "preserved tokens").
PRESERVED_MARKERS = (THINK_OPEN, THINK_CLOSE, HERMES_OPEN, HERMES_CLOSE, LLAMA3_PYTHON_TAG, MISTRAL_PREFIX)


@dataclass(frozen=True)
class ChatFormat:
    """What a model's output may hold besides content."""

    tools: ToolFormat | None  # None: this model cannot take tools
    reasoning: bool  # <think>...</think> blocks go to reasoning_content


def detect_tool_format(source: str) -> ToolFormat:
    """The tool-call format a Jinja chat template was written for; generic when it
    shows none (llama.cpp checks the same markers, in the same order of specificity)."""
    if MISTRAL_PREFIX in source:
        return "mistral"
    if HERMES_OPEN in source:
        return "hermes"
    # Llama 3.x templates write calls as {"name": ..., "parameters": ...} under their
    # header tokens; 3.1 also names <|python_tag|> for its built-in tools.
    if "<|start_header_id|>" in source and (LLAMA3_PYTHON_TAG in source or '"parameters"' in source):
        return "llama3"
    return "generic"


def detect_reasoning(source: str) -> bool:
    """Whether a template's model thinks in <think> blocks (Qwen 3, DeepSeek-R1, QwQ)."""
    return THINK_OPEN in source or THINK_CLOSE in source


def resolve(option: str, source: str | None, reasoning: bool) -> ChatFormat:
    """A model's format from its `tool_format` and `reasoning` options and its template's
    source (None: a built-in template, which is C++ code that cannot render tools, so it
    takes them in the generic format, where the template never sees them, as llama-server
    offers tools to any template: common/chat.cpp falls back to its generic format; the
    config check refuses any other tool_format with a built-in template)."""
    if source is None:
        tools: ToolFormat | None = "generic" if option in ("auto", "generic") else None
        return ChatFormat(tools=tools, reasoning=False)
    if option == "auto":
        tools = detect_tool_format(source)
    else:
        assert option in ("hermes", "llama3", "mistral", "generic"), option
        tools = option  # type: ignore[assignment]
    return ChatFormat(tools=tools, reasoning=reasoning and detect_reasoning(source))


def ends_in_reasoning(prompt: str, tail: int) -> bool:
    """Whether `prompt` ends inside an open <think> block that its last `tail` characters
    opened (the generation prompt and any assistant prefill): an opening tag earlier than
    that belongs to the history, not to the turn being generated."""
    i = prompt.rfind(THINK_OPEN)
    return i >= 0 and i >= len(prompt) - tail and THINK_CLOSE not in prompt[i:]


def prefill_of(messages: Sequence[ChatMessage]) -> ChatMessage | None:
    """The final assistant message that the reply continues, if the conversation ends
    with one (llama-server's assistant prefill)."""
    if messages and messages[-1].role == "assistant" and not messages[-1].tool_calls:
        return messages[-1]
    return None


# ---- the generic format --------------------------------------------------------------------


def parse_arguments(text: str) -> Any:
    """A call's arguments as a JSON value when they are valid JSON, else the text itself
    (templates write them with `| tojson`, which would quote a string a second time)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def generic_instructions(tools: Sequence[dict[str, Any]]) -> str:
    """The system text that offers `tools` to a model whose template knows none."""
    listed = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return (
        "You can call these tools (JSON descriptions, one per line):\n"
        f"{listed}\n\n"
        "Reply with one JSON object and nothing else. To call tools:\n"
        '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments as the tool\'s '
        'parameters schema describes>}}]}\n'
        'To answer without calling a tool: {"response": "<your answer>"}'
    )


def generic_messages(
    messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]] | None, system_role: bool
) -> list[ChatMessage]:
    """The conversation rewritten for a template that knows no tools.

    Earlier calls become the assistant's JSON reply, tool results become user messages
    (consecutive results are merged, since many templates insist that roles alternate),
    and the tool instructions join the system message. A template that refuses a system
    role (`system_role` False) gets the system text at the start of the first user message.
    """
    out: list[ChatMessage] = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            calls = [{"name": c.name, "arguments": parse_arguments(c.arguments)} for c in m.tool_calls]
            reply: dict[str, Any] = {"tool_calls": calls}
            if m.content:
                reply["content"] = m.content
            out.append(ChatMessage(role="assistant", content=json.dumps(reply, ensure_ascii=False)))
        elif m.role == "tool":
            result: dict[str, Any] = {"tool_response": {"content": m.content}}
            if m.name:
                result["tool_response"]["name"] = m.name
            if m.tool_call_id:
                result["tool_response"]["tool_call_id"] = m.tool_call_id
            text = json.dumps(result, ensure_ascii=False)
            if out and out[-1].role == "user" and out[-1].content.startswith('{"tool_response"'):
                out[-1] = ChatMessage(role="user", content=out[-1].content + "\n" + text)
            else:
                out.append(ChatMessage(role="user", content=text))
        else:
            out.append(ChatMessage(role=m.role, content=m.content))
    if tools:
        instructions = generic_instructions(tools)
        if out and out[0].role == "system":
            out[0] = ChatMessage(role="system", content=out[0].content + "\n\n" + instructions)
        else:
            out.insert(0, ChatMessage(role="system", content=instructions))
    if not system_role and out and out[0].role == "system":
        system = out.pop(0).content
        if out and out[0].role == "user":
            out[0] = ChatMessage(role="user", content=system + "\n\n" + out[0].content)
        else:
            out.insert(0, ChatMessage(role="user", content=system))
    return out


def needs_generic_rewrite(messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]] | None) -> bool:
    """Whether a generic-format conversation has anything tool-related to rewrite."""
    return bool(tools) or any(m.role == "tool" or m.tool_calls for m in messages)
