"""router/api/anthropic/translate.py: Anthropic's Messages body as the internal request,
against Anthropic's API reference and llama-server's conversion
(tools/server/server-chat.cpp, server_chat_convert_anthropic_to_oai), where Corral keeps
what llama-server drops (tool_choice none and tool, disable_parallel_tool_use)."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest

from router.api.anthropic.errors import message
from router.api.anthropic.schemas import MessagesRequest
from router.api.anthropic import schemas as s
from router.api.anthropic.translate import messages_job, served_tools, system_text
from router.server.json_body import decode
from worker.protocol import MEDIA_MARKER
from supervisor.errors import CorralError, InvalidRequest, Unsupported
from worker.protocol import ChatMessage, SamplingParams, ToolCall

WEATHER = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def job(**body: Any) -> Any:
    body.setdefault("max_tokens", 32)
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    r = decode(msgspec.json.encode(body), MessagesRequest, api="Anthropic")
    return messages_job(r, "m", SamplingParams())


def refused(**body: Any) -> CorralError:
    with pytest.raises((InvalidRequest, Unsupported)) as e:
        job(**body)
    return e.value


def test_blocks_become_the_chat_turns_a_template_expects() -> None:
    j = job(
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Call it.", "signature": "sig"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                {"type": "text", "text": "And tomorrow?"},
            ]},
        ],
        tools=[WEATHER],
    )
    assert j.messages == (
        ChatMessage(role="system", content="Be brief.\n\nUse tools."),
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(
            role="assistant", content="Checking.", reasoning_content="Call it.",
            tool_calls=[ToolCall(id="toolu_1", name="get_weather", arguments='{"city": "Paris"}')],
        ),
        # The result answers the call first, then the user's own words (llama-server puts
        # the user's text before the result, away from the call it answers).
        ChatMessage(role="tool", content="Sunny", tool_call_id="toolu_1"),
        ChatMessage(role="user", content="And tomorrow?"),
    )
    assert j.tools.offered is not None and j.tools.offered[0]["function"]["parameters"] == WEATHER["input_schema"]
    assert j.tools.forced is None and j.tools.parallel


def test_a_failed_tool_result_says_so_to_the_model() -> None:
    j = job(messages=[
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "timeout", "is_error": True}]},
    ], tools=[WEATHER])
    assert j.messages[-1] == ChatMessage(role="tool", content="Error: timeout", tool_call_id="t1")


def test_tool_choice_maps_every_variant() -> None:
    forced = job(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}).tools
    assert forced.forced is not None and [t["function"]["name"] for t in forced.forced] == ["get_weather"]
    assert not forced.parallel
    assert job(tools=[WEATHER], tool_choice={"type": "any"}).tools.forced is not None
    assert job(tools=[WEATHER], tool_choice={"type": "none"}).tools.offered is None  # llama-server ignores none
    assert job(tools=[WEATHER], tool_choice={"type": "auto"}).tools.forced is None
    assert refused(tools=[WEATHER], tool_choice={"type": "tool"}).param == "tool_choice.name"
    assert refused(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}).param == "tool_choice.name"


def test_thinking_sets_the_templates_switch() -> None:
    assert job(thinking={"type": "enabled", "budget_tokens": 2048}).template_kwargs == {"enable_thinking": True}
    assert job(thinking={"type": "disabled"}).template_kwargs == {"enable_thinking": False}
    assert job(thinking={"type": "adaptive"}).template_kwargs is None


def test_sampling_and_stop_sequences() -> None:
    j = job(temperature=0.2, top_p=0.9, top_k=5, stop_sequences=["END"], max_tokens=7)
    p = j.params
    assert (p.temperature, p.top_p, p.top_k, p.stop, p.max_tokens) == (0.2, 0.9, 5, ["END"], 7)
    assert not j.stream and job(stream=True).stream


def test_output_format_constrains_the_answer() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for body in ({"output_format": {"type": "json_schema", "schema": schema}}, {"output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}}):
        c = job(**body).params.constraint
        assert c is not None and c.kind == "json_schema" and json.loads(c.source)["required"] == ["a"]
    assert job(output_config={"effort": "high"}).params.constraint is None


def test_fields_claude_code_sends_are_accepted_and_ignored() -> None:
    j = job(metadata={"user_id": "u"}, context_management={"edits": []}, output_config={"effort": "high"}, service_tier="auto")
    assert j.messages == (ChatMessage(role="user", content="hi"),)


def test_claude_codes_billing_stamp_is_blanked_so_the_prefix_cache_holds() -> None:
    text = "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=a5145;You are Claude Code."
    assert system_text(text) == text.replace("cch=a5145;", "cch=fffff;")
    assert system_text("cch=a5145; elsewhere") == "cch=a5145; elsewhere"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": ""}}]}]},
         "messages[0].content[0].source.media_type"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]},
         "messages[0].content[0].source.data"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "ftp://x"}}]}]},
         "messages[0].content[0].source.url"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]},
         "messages[0].content[0].source.type"),
        ({"messages": [{"role": "assistant", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]}, "messages[0].content[0].type"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]}, "tools[0].name"),
        ({"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "tools[0].input_schema"),
        ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
        ({"output_format": {"type": "text"}}, "output_format"),
    ],
)
def test_each_bad_input_is_a_400_naming_its_parameter(body: dict[str, Any], param: str) -> None:
    exc = refused(**body)
    # Anthropic's error has no `param`: the message it answers names it.
    assert exc.param == param and param in message(exc)


@pytest.mark.parametrize(
    "body, path",
    [
        ({"messages": [{"role": "user", "content": [{"type": "search_result"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"max_tokens": "ten"}, "max_tokens"),
    ],
)
def test_shapes_the_decoder_refuses_name_their_path(body: dict[str, Any], path: str) -> None:
    assert path in (refused(**body).param or "")


def test_a_system_message_among_the_turns_joins_the_turn_it_follows() -> None:
    """Claude Code (its mid-conversation-system beta) sends a system message after the
    user's first turn; Qwen3's and Gemma's templates raise on a system message not first."""
    j = job(system="S", messages=[
        {"role": "user", "content": [{"type": "text", "text": "say ok"}]},
        {"role": "system", "content": "Agents: none."},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": [{"type": "text", "text": "Later."}]},
    ])
    assert j.messages == (
        ChatMessage(role="system", content="S"),
        ChatMessage(role="user", content="say ok\n\nAgents: none."),
        ChatMessage(role="assistant", content="ok"),
        ChatMessage(role="user", content="Later."),
    )
    assert job(messages=[{"role": "system", "content": "A"}, {"role": "user", "content": "hi"}]).messages == (
        ChatMessage(role="system", content="A"), ChatMessage(role="user", content="hi"),
    )


def test_tool_names_may_be_as_long_as_anthropic_takes() -> None:
    """Anthropic takes names of up to 128 characters (OpenAI 64): Claude Code's MCP tools
    are named mcp__SERVER__TOOL."""
    long = "mcp__" + "s" * 60 + "__" + "t" * 40
    assert job(tools=[{**WEATHER, "name": long}]).tools.offered[0]["function"]["name"] == long
    assert refused(tools=[{**WEATHER, "name": "x" * 129}]).param == "tools[0].name"


def test_served_tools_leave_out_anthropics_server_tools() -> None:
    """hosted_tools = "skip" (issue 41, item 6): client tools stay, versioned types go, named."""
    raw = msgspec.convert(
        [{"type": "web_search_20250305", "name": "web_search"}, {"name": "Read"}, {"type": "custom", "name": "Edit"},
         {"type": "bash_20250124", "name": "bash"}],
        list[s.Tool],
    )
    kept, skipped = served_tools(raw)
    assert [t.name for t in kept or ()] == ["Read", "Edit"]
    assert skipped == ["web_search_20250305", "bash_20250124"]


PNG_B64 = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 8).decode()


def test_an_images_declared_type_must_be_its_data() -> None:
    exc = refused(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": PNG_B64}}]}])
    assert exc.param == "messages[0].content[0].source.media_type" and "image/png, not image/jpeg" in message(exc)


def test_a_tool_results_images_go_with_it() -> None:
    from router.api.anthropic.translate import chat_messages

    blocks = msgspec.convert([
        {"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "the screen:"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}}]},
    ], list[s.Block])
    out = chat_messages(None, [s.Message(role="user", content=blocks)])
    assert out[0].role == "tool" and out[0].content == f"the screen:\n\n{MEDIA_MARKER}"
    assert out[0].media is not None and out[0].media[0].param == "messages[0].content[0].content[1].source.data"
