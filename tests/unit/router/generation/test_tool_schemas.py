"""Validation of tools, tool_choice and tool-call messages: every bad value is a 400 that
names its parameter."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from router.api.openai import translate
from router.server.json_body import decode
from router.api.openai import fields as rf
from router.api.openai import schemas as s
from router.generation.tool_schemas import tool_request
from supervisor.errors import InvalidRequest
from worker.protocol import ChatMessage, ToolCall

F = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
G = {"type": "function", "function": {"name": "now"}}


def chat(**fields: Any) -> s.ChatRequest:
    fields.setdefault("model", "m")
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return decode(msgspec.json.encode(fields), s.ChatRequest)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([{"type": "retrieval"}], None, "tools[0].type"),
        ([{"type": "function"}], None, "tools[0].function"),
        ([{"type": "function", "function": {"name": "has space"}}], None, "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "x" * 65}}], None, "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "f", "parameters": "{}"}}], None, "tools[0].function.parameters"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}], None, "tools[0].function.parameters"),
        ([{"type": "function", "function": {"name": "f", "extra": 1}}], None, "tools[0].function.extra"),
        ([F, F], None, "tools[1].function.name"),
        (None, "sometimes", "tool_choice"),
        ([], {"type": "function"}, "tool_choice"),
        ([F], {"type": "function", "function": {"name": "other"}}, "tool_choice"),
        ([F], "sometimes", "tool_choice"),
        ([F], {"type": "function"}, "tool_choice"),
    ],
)
def test_bad_tools_and_choices_name_their_parameter(tools: Any, choice: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        tool_request(tools, choice, None)
    assert info.value.param == param


@pytest.mark.parametrize("tools", [None, []])
@pytest.mark.parametrize("choice", [None, "none", "auto", "required", {"type": "function", "function": {"name": "f"}}])
def test_no_tools_is_a_request_without_tools_whatever_the_choice(tools: Any, choice: Any) -> None:
    """Issue 22, item 2: llama-server takes `tools: []`, and tool_choice with no tools, as
    a request without tools (tools/server/server-common.cpp: `has_tools` needs a non-empty
    array; tool calls are parsed only when `inputs.tools` is not empty). Was a 400."""
    assert tool_request(tools, choice, None) == tool_request(None, None, None)
    assert tool_request(tools, choice, None).offered is None and tool_request(tools, choice, None).forced is None


def test_choices() -> None:
    assert tool_request([F, G], None, None).offered == (F, G)
    assert tool_request([F, G], None, None).forced is None
    assert tool_request([F, G], "none", None).offered is None  # not even rendered
    assert tool_request([F, G], "required", False).forced == (F, G)
    assert tool_request([F, G], "required", False).parallel is False
    named = tool_request([F, G], {"type": "function", "function": {"name": "now"}}, None)
    assert named.offered == (F, G) and named.forced == (G,)
    assert tool_request(None, "auto", None).offered is None


def test_tool_call_messages_become_protocol_messages() -> None:
    r = chat(
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "cold", "name": "get_weather"},
        ]
    )
    assert rf.chat_messages(r)[1:] == [
        ChatMessage(role="assistant", content="", tool_calls=[ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}')]),
        ChatMessage(role="tool", content="cold", name="get_weather", tool_call_id="call_1"),
    ]


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "tool", "content": "x"}, "messages[1].tool_call_id"),
        ({"role": "assistant", "tool_calls": {"id": "1"}}, "messages[1].tool_calls"),
        ({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}, "messages[1].tool_calls[0].id"),
        ({"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": {}}}]}, "messages[1].tool_calls[0].function.arguments"),
        ({"role": "user", "content": "x", "tool_calls": []}, "messages[1].tool_calls"),
        ({"role": "assistant", "content": "x", "reasoning_content": 3}, "messages[1].reasoning_content"),
    ],
)
def test_bad_tool_messages_name_their_parameter(message: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        rf.chat_messages(chat(messages=[{"role": "user", "content": "q"}, message]))
    assert info.value.param == param


def test_two_final_assistant_messages_are_refused() -> None:
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(InvalidRequest, match="prefill") as info:
        rf.chat_messages(chat(messages=msgs))
    assert info.value.param == "messages"
    # One is a prefill, and fine.
    assert rf.chat_messages(chat(messages=msgs[:2]))[-1] == ChatMessage(role="assistant", content="a")


def test_chat_template_kwargs_are_accepted() -> None:
    assert chat(chat_template_kwargs={"enable_thinking": False}).chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("key", rf.TEMPLATE_OWN_VARIABLES)
def test_chat_template_kwargs_cannot_set_what_the_request_sets(key: str) -> None:
    # A second `messages` broke rendering with a 400 naming messages; `tools` handed the
    # template tools the request never offered.
    with pytest.raises(InvalidRequest) as info:
        translate.chat_job(chat(chat_template_kwargs={"enable_thinking": False, key: 1}), "m")
    assert info.value.param == f"chat_template_kwargs.{key}"
    job = translate.chat_job(chat(chat_template_kwargs={"enable_thinking": False}), "m")
    assert job.template_kwargs == {"enable_thinking": False}
