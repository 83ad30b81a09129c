"""How a model writes tool calls and reasoning, decided from its chat template.

Pure and free of llama_cpp: the worker decides a model's format when it loads, reports it
in Ready, and the router parses output by it (router/generation/tool_calls.py, router/generation/reasoning.py).

The formats are llama.cpp's (common/chat.cpp) for the families that matter most:
- hermes: Hermes, Qwen 2.5 and Qwen 3 write `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
- llama3: Llama 3.1-3.3 write a bare JSON object `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>`.
- mistral: Mistral Nemo and later write `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`.
- block formats (BLOCKS): calls in a section between an opening and a closing marker,
  each in the family's own layout inside (router/generation/tool_blocks.py reads them):
  DeepSeek R1 and V3.1, Command R7B, Kimi K2, Nemotron v2, Seed-OSS, MiniMax M2,
  FireFunction v2, Functionary v3.1 (Llama 3.1), Apriel. The hermes family's
  `<tool_call>` takes Qwen3-Coder's and GLM 4.5's tagged bodies too, and mistral's
  `[TOOL_CALLS]` Mistral Small 3.2's `name[ARGS]{...}`.
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
from worker.protocol.parameters import TOOL_FORMATS

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# Each family's reasoning block, the most specific first (`<think>` is the default): Command
# R7B's, Magistral's and Ministral's, Seed-OSS's, MiniMax M3's (llama.cpp's auto-parser
# finds these markers in each template; its tests/test-chat.cpp has their outputs).
REASONING_TAGS: tuple[tuple[str, str], ...] = (
    ("<|START_THINKING|>", "<|END_THINKING|>"),
    ("<|channel>thought", "<channel|>"),  # Gemma 4
    ("<|open|>think<|sep|>", "<|close|>think<|sep|>"),  # Kimi K3
    ("[THINK]", "[/THINK]"),
    ("<seed:think>", "</seed:think>"),
    ("<mm:think>", "</mm:think>"),
    (THINK_OPEN, THINK_CLOSE),
)

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
LLAMA3_PYTHON_TAG = "<|python_tag|>"
MISTRAL_PREFIX = "[TOOL_CALLS]"

# The block formats: the section's opening marker, and its closing one (None: the JSON
# value after the opening marker is the whole section). As llama.cpp's common/chat.cpp and
# its auto-parser find them in each family's template (models/templates/*.jinja).
BLOCKS: dict[str, tuple[str, str | None]] = {
    "deepseek_r1": ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    "deepseek_v3_1": ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    "command_r7b": ("<|START_ACTION|>", "<|END_ACTION|>"),
    "kimi_k2": ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
    "nemotron": ("<TOOLCALL>", "</TOOLCALL>"),
    "seed_oss": ("<seed:tool_call>", "</seed:tool_call>"),
    "minimax_m2": ("<minimax:tool_call>", "</minimax:tool_call>"),
    "firefunction": (" functools", None),
    "functionary_v3_1": ("<function=", "</function>"),
    "apriel": ("<tool_calls>", "</tool_calls>"),
    "lfm2": ("<|tool_call_start|>", "<|tool_call_end|>"),
    "gemma4": ("<|tool_call>", "<tool_call|>"),
    "apertus": ("<|tools_prefix|>", "<|tools_suffix|>"),
    "deepseek_v3_2": ("<｜DSML｜function_calls>", "</｜DSML｜function_calls>"),
    "deepseek_v4": ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"),
    "kimi_k3": ("<|open|>tools<|sep|>", "<|close|>tools<|sep|>"),
    "gigachat_v3": ("<|message_sep|>\n\nfunction call<|role_sep|>\n", None),
    "gigachat_v3_1": ("<|function_call|>", None),
    "command_r_plus": ("Action:\n```json\n", "```"),
    "minicpm5": ('<function name="', "</function>"),
    "hy3": ("<tool_calls:opensource>", "</tool_calls:opensource>"),
    "minimax_m3": ("]<]minimax[>[<tool_call>", "]<]minimax[>[</tool_call>"),
}
# GPT-OSS's harmony format: messages of a header and a body (router/generation/harmony.py).
HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>")
# muse-glimmer's: messages to a recipient (router/generation/muse.py).
MUSE_MARKERS = ("<|eom|>", "<|eot|>")

# Markers a family writes around its answer's content, which are no part of it (Command
# R7B's <|START_RESPONSE|>...<|END_RESPONSE|>; llama.cpp's auto-parser strips them too).
CONTENT_WRAPPERS: dict[str, tuple[str, ...]] = {
    "command_r7b": ("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
    "kimi_k3": ("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>"),
}

# Markers inside a block, which must render as text too.
INNER_MARKERS = (
    "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
    "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
    "[ARGS]", "[CALL_ID]", "<|START_RESPONSE|>", "<|END_RESPONSE|>", '<|"|>', "<|open|>", "<|close|>", "<|sep|>",
    "<|message_sep|>", "<|role_sep|>",
)

# Text the worker must render even where it is a special token, because the router parses
# by it (llama-server's "preserved tokens").
PRESERVED_MARKERS = (
    *(tag for pair in REASONING_TAGS for tag in pair), HERMES_OPEN, HERMES_CLOSE, LLAMA3_PYTHON_TAG, MISTRAL_PREFIX,
    *(m for pair in BLOCKS.values() for m in pair if m is not None and m.strip() == m),
    *INNER_MARKERS,
    *HARMONY_MARKERS,
    *MUSE_MARKERS,
)


@dataclass(frozen=True)
class ChatFormat:
    """What a model's output may hold besides content."""

    tools: ToolFormat | None  # None: this model cannot take tools
    reasoning: bool  # reasoning blocks go to reasoning_content
    reasoning_tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)  # what opens and closes one


def detect_tool_format(source: str) -> ToolFormat:
    """The tool-call format a Jinja chat template was written for; generic when it
    shows none (llama.cpp checks the same markers, in the same order of specificity:
    the rarest first, so a template that names `<tool_call>` among others is read by
    its own section markers)."""
    if "<|channel|>" in source and "<|start|>assistant" in source:
        return "gpt_oss"
    if ">>>all" in source:
        return "functionary_v3_2"
    if "<atem:function_calls>" in source:
        return "muse_glimmer"
    if "'<|tool_call>call:'" in source:
        return "gemma4"
    if "]<]minimax[>[" in source:  # MiniMax M3 sets its tags off with this namespace
        return "minimax_m3"
    if "':opensource'" in source:  # Tencent Hy3 suffixes its tags
        return "hy3"
    if '<function name="' in source and '<param name="' in source:
        return "minicpm5"
    if "｜DSML｜" in source:  # DeepSeek V3.2 names its block function_calls, V4 tool_calls
        return "deepseek_v3_2" if "function_calls" in source else "deepseek_v4"
    if "<|open|>" in source and "'call'" in source and "'tools'" in source:
        return "kimi_k3"
    if "<|function_call|>" in source:
        return "gigachat_v3_1"
    if "function call" in source and "<|role_sep|>" in source:
        return "gigachat_v3"
    if "Action:\\n```json" in source:
        return "command_r_plus"
    if "<|tool_list_start|>" in source or "List of tools: [" in source:
        return "lfm2"
    if MISTRAL_PREFIX in source:
        return "mistral"
    if BLOCKS["deepseek_r1"][0] in source:
        # R1 writes `function<｜tool▁sep｜>name` and a fenced JSON; V3.1 `name<｜tool▁sep｜>`
        return "deepseek_r1" if "```json" in source else "deepseek_v3_1"
    sectioned: tuple[ToolFormat, ...] = (
        "command_r7b", "kimi_k2", "nemotron", "seed_oss", "minimax_m2", "apriel", "apertus",
    )
    for fmt in sectioned:
        if BLOCKS[fmt][0] in source:
            return fmt
    if "functools[" in source:
        return "firefunction"
    if HERMES_OPEN in source:
        return "hermes"
    if "<function=" in source and "<|start_header_id|>" in source:
        return "functionary_v3_1"
    # Llama 3.x templates write calls as {"name": ..., "parameters": ...} under their
    # header tokens; 3.1 also names <|python_tag|> for its built-in tools.
    if "<|start_header_id|>" in source and (LLAMA3_PYTHON_TAG in source or '"parameters"' in source):
        return "llama3"
    return "generic"


def call_opening(fmt: str | None) -> str | None:
    """The text a call of format `fmt` starts with, where it has a marker of its own."""
    if fmt in BLOCKS:
        return BLOCKS[fmt][0].strip()
    return {"hermes": HERMES_OPEN, "mistral": MISTRAL_PREFIX, "llama3": LLAMA3_PYTHON_TAG}.get(fmt or "")


def detect_reasoning(source: str) -> bool:
    """Whether a template's model thinks in reasoning blocks (Qwen 3's and DeepSeek-R1's
    <think>, or another family's tags: REASONING_TAGS)."""
    return reasoning_tags(source) is not None


def reasoning_tags(source: str) -> tuple[str, str] | None:
    """The reasoning block a template writes or reads, or None."""
    if "open_tag('think')" in source:  # Kimi K3 builds its tags with a macro
        return "<|open|>think<|sep|>", "<|close|>think<|sep|>"
    if "':opensource'" in source and "'<think{}>'" in source:  # Tencent Hy3's, built likewise
        return "<think:opensource>", "</think:opensource>"
    for opening, closing in REASONING_TAGS:
        if opening in source or closing in source:
            return opening, closing
    return None


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
        assert option in TOOL_FORMATS, option
        tools = option  # type: ignore[assignment]
    # GPT-OSS reasons in its analysis channel, not in tagged blocks.
    tags = reasoning_tags(source)
    return ChatFormat(
        tools=tools,
        reasoning=reasoning and (tags is not None or tools == "gpt_oss"),
        reasoning_tags=tags or (THINK_OPEN, THINK_CLOSE),
    )


def ends_in_reasoning(prompt: str, tail: int, tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)) -> bool:
    """Whether `prompt` ends inside an open <think> block that its last `tail` characters
    opened (the generation prompt and any assistant prefill): an opening tag earlier than
    that belongs to the history, not to the turn being generated."""
    opening, closing = tags
    i = prompt.rfind(opening)
    return i >= 0 and i >= len(prompt) - tail and closing not in prompt[i:]


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
    except (ValueError, RecursionError):  # nested past the decoder's depth: text, as invalid JSON
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
        return with_system_text(out, generic_instructions(tools), system_role)
    return out if system_role else _system_into_user(out)


# How a call is written in each format, for the tool instructions of a template that
# renders calls but not the tools on offer (DeepSeek's: its model cards describe the tools
# in the system message). NAME and ARGUMENTS stand for the function and its JSON arguments.
CALL_LAYOUTS: dict[str, str] = {
    "hermes": '<tool_call>\n{"name": NAME, "arguments": ARGUMENTS}\n</tool_call>',
    "llama3": '{"name": NAME, "parameters": ARGUMENTS}',
    "mistral": '[TOOL_CALLS][{"name": NAME, "arguments": ARGUMENTS}]',
    "deepseek_r1": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGUMENTS\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "deepseek_v3_1": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "command_r7b": '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": NAME, "parameters": ARGUMENTS}]<|END_ACTION|>',
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>ARGUMENTS<|tool_call_end|><|tool_calls_section_end|>",
    "nemotron": '<TOOLCALL>[{"name": NAME, "arguments": ARGUMENTS}]</TOOLCALL>',
    "seed_oss": "<seed:tool_call>\n<function=NAME>\n<parameter=KEY>VALUE</parameter>\n</function>\n</seed:tool_call>",
    "minimax_m2": '<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="KEY">VALUE</parameter>\n</invoke>\n</minimax:tool_call>',
    "firefunction": ' functools[{"name": NAME, "arguments": ARGUMENTS}]',
    "functionary_v3_1": "<function=NAME>ARGUMENTS</function>",
    "apriel": '<tool_calls>[{"name": NAME, "arguments": ARGUMENTS}]</tool_calls>',
    "gpt_oss": "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGUMENTS<|call|>",
    "functionary_v3_2": ">>>NAME\nARGUMENTS",
    "lfm2": '<|tool_call_start|>[NAME(KEY="VALUE")]<|tool_call_end|>',
    "gemma4": '<|tool_call>call:NAME{KEY:<|"|>VALUE<|"|>}<tool_call|>',
    "apertus": "<|tools_prefix|>[{NAME: ARGUMENTS}]<|tools_suffix|>",
    "deepseek_v3_2": '<｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="KEY" string="true">VALUE</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
    "deepseek_v4": '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="KEY" string="true">VALUE</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
    "kimi_k3": '<|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|><|open|>argument key="KEY"<|sep|>VALUE<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>',
    "gigachat_v3": '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": NAME, "arguments": ARGUMENTS}',
    "gigachat_v3_1": '<|function_call|>{"name": NAME, "arguments": ARGUMENTS}',
    "command_r_plus": 'Action:\n```json\n[{"tool_name": NAME, "parameters": ARGUMENTS}]\n```',
    "minicpm5": '<function name="NAME"><param name="KEY">VALUE</param></function>',
    "hy3": "<tool_calls:opensource>\n<tool_call:opensource>NAME<tool_sep:opensource>\n<arg_key:opensource>KEY</arg_key:opensource>\n<arg_value:opensource>VALUE</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>",
    "muse_glimmer": '<|start|>assistant to=NAME<|message|><atem:function_calls>\n<atem:invoke name="NAME">\n<atem:parameter name="KEY">VALUE</atem:parameter>\n</atem:invoke>\n</atem:function_calls>',
    "minimax_m3": ']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="NAME">]<]minimax[>[<KEY>VALUE]<]minimax[>[</KEY>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>',
}


def tools_instructions(fmt: str, tools: Sequence[dict[str, Any]]) -> str:
    """The system text that offers `tools` to a model whose template renders calls in
    format `fmt` but never the tools themselves."""
    listed = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return (
        "You can call these tools (JSON descriptions, one per line):\n"
        f"{listed}\n\n"
        f"To call a tool, write exactly:\n{CALL_LAYOUTS[fmt]}"
    )


def with_system_text(messages: Sequence[ChatMessage], text: str, system_role: bool) -> list[ChatMessage]:
    """`text` added to the system message (made where there is none; put at the start of
    the first user message where the template refuses a system role)."""
    out = list(messages)
    if out and out[0].role == "system":
        out[0] = ChatMessage(role="system", content=out[0].content + "\n\n" + text)
    else:
        out.insert(0, ChatMessage(role="system", content=text))
    return out if system_role else _system_into_user(out)


def _system_into_user(messages: list[ChatMessage]) -> list[ChatMessage]:
    """A leading system message moved to the start of the first user message, for a
    template that refuses a system role (gemma's)."""
    out = list(messages)
    if not out or out[0].role != "system":
        return out
    system = out.pop(0).content
    if out and out[0].role == "user":
        out[0] = ChatMessage(role="user", content=system + "\n\n" + out[0].content)
    else:
        out.insert(0, ChatMessage(role="user", content=system))
    return out


def needs_generic_rewrite(messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]] | None) -> bool:
    """Whether a generic-format conversation has anything tool-related to rewrite."""
    return bool(tools) or any(m.role == "tool" or m.tool_calls for m in messages)
