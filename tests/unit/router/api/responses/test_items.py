"""router/api/responses/items.py and translate.py: the Responses API's `input` items and
tools as chat turns and function tools, as the openai SDK, the OpenAI Agents SDK and
Codex CLI send them (an agent sends its earlier output items back as input)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from router.api.responses.items import served_tools, chat_messages, tool_request
from router.api.responses.schemas import ResponsesRequest
from router.api.responses.translate import echo, refuse_unserved, responses_job
from router.generation.tool_schemas import ToolRequest
from router.server.json_body import decode
from supervisor.errors import CorralError, InvalidRequest, Unsupported
from worker.protocol import MEDIA_MARKER, ChatMessage, Media, SamplingParams, ToolCall

NO_TOOLS = ToolRequest()
FN = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": True}


def request(**body: Any) -> ResponsesRequest:
    r: ResponsesRequest = decode(msgspec.json.encode(body), ResponsesRequest)
    return r


def test_a_string_is_one_user_message() -> None:
    assert chat_messages("hi") == [ChatMessage(role="user", content="hi")]


def test_an_agents_own_output_items_sent_back_make_one_assistant_turn() -> None:
    turns = chat_messages([
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Call it."}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}', "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Lyon"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "Rain"}]},
        {"role": "assistant", "content": "Sunny in Paris, rain in Lyon."},
    ])
    assert turns == [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(role="assistant", content="Checking.", reasoning_content="Call it.", tool_calls=[
            ToolCall(id="call_1", name="get_weather", arguments='{"city":"Paris"}'),
            ToolCall(id="call_2", name="get_weather", arguments='{"city":"Lyon"}'),
        ]),
        ChatMessage(role="tool", content="Sunny", tool_call_id="call_1"),
        ChatMessage(role="tool", content="Rain", tool_call_id="call_2"),
        ChatMessage(role="assistant", content="Sunny in Paris, rain in Lyon."),
    ]


def test_function_tools_are_flat_and_tool_choice_names_one() -> None:
    t, namespaces = tool_request([FN], {"type": "function", "name": "get_weather"}, False)
    assert t.offered is not None and t.offered[0]["function"]["name"] == "get_weather"
    assert t.offered[0]["function"]["parameters"] == FN["parameters"]
    assert t.forced is not None and not t.parallel
    assert tool_request([FN], "required", None)[0].forced is not None
    assert tool_request([FN], "none", None)[0].offered is None
    assert namespaces == {}


def test_a_namespaces_functions_are_offered_and_their_calls_name_it() -> None:
    """Codex groups its sub-agent tools in a `namespace` tool (captured from codex 0.171)."""
    spawn = {"type": "function", "name": "spawn_agent", "description": "Spawn", "parameters": {"type": "object", "properties": {}}}
    t, namespaces = tool_request([FN, {"type": "namespace", "name": "multi_agent_v1", "description": "Agents", "tools": [spawn]}], None, None)
    assert t.offered is not None and [x["function"]["name"] for x in t.offered] == ["get_weather", "spawn_agent"]
    assert namespaces == {"spawn_agent": "multi_agent_v1"}


def test_the_job_puts_instructions_first_and_takes_text_format_and_effort() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    r = request(
        input="hi", instructions="Be brief.", max_output_tokens=50, temperature=0.1, top_p=0.5,
        text={"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": True}},
        reasoning={"effort": "none"}, store=False,
        # Codex's and the agents SDK's fields Corral does not act on.
        include=["reasoning.encrypted_content"], prompt_cache_key="k", client_metadata={"a": "b"}, truncation="auto",
    )
    j = responses_job(r, "m", SamplingParams(), tuple(chat_messages(r.input)), NO_TOOLS)
    assert j.messages == (ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="hi"))
    assert (j.params.max_tokens, j.params.temperature, j.params.top_p) == (50, 0.1, 0.5)
    assert j.params.constraint is not None and j.params.constraint.param == "text.format"
    assert set(json.loads(j.params.constraint.source)["properties"]) == {"a"}  # narrowed, as chat's are
    assert j.template_kwargs == {"enable_thinking": False}
    e = echo(r, j.params)
    assert e["store"] is False and e["text"]["format"]["type"] == "json_schema" and e["instructions"] == "Be brief."
    json_object = request(input="hi", text={"format": {"type": "json_object"}})
    assert responses_job(json_object, "m", SamplingParams(), (), NO_TOOLS).params.constraint is not None


def _refused(fn: Any) -> CorralError:
    with pytest.raises((InvalidRequest, Unsupported)) as e:
        fn()
    return e.value


@pytest.mark.parametrize(
    "items, param",
    [
        ([], "input"),
        ([{"role": "robot", "content": "x"}], "input[0].role"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}], "input[0].content[0].image_url"),
        ([{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}], "input[0].content[0].file_id"),
        ([{"role": "assistant", "content": [{"type": "input_image", "image_url": "data:image/png;base64,aGk="}]}],
         "input[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "input_file", "file_data": "x"}]}], "input[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "nope"}]}], "input[0].content[0].type"),
        ([{"role": "user", "content": 5}], "input[0].content"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0].call_id"),
        ([{"type": "function_call_output", "output": "x"}], "input[0].call_id"),
        ([{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
        ([{"type": "web_search_call", "id": "ws_1"}], "input[0].type"),
        (["hi"], "input[0]"),
    ],
)
def test_each_bad_item_is_a_400_naming_its_path(items: list[Any], param: str) -> None:
    exc = _refused(lambda: chat_messages(items))
    assert exc.param == param and param in exc.message


@pytest.mark.parametrize(
    "tools, choice, param",
    [
        ([{"type": "web_search"}], None, "tools[0].type"),
        ([{"type": "custom", "name": "apply_patch"}], None, "tools[0].type"),
        ([{**FN, "name": "bad name"}], None, "tools[0].name"),
        ([FN], {"type": "function", "name": "nope"}, "tool_choice"),
        ([FN], {"type": "allowed_tools", "tools": []}, "tool_choice"),
    ],
)
def test_each_bad_tool_is_a_400_naming_it(tools: list[Any], choice: Any, param: str) -> None:
    assert _refused(lambda: tool_request(tools, choice, None)).param == param


def test_a_bad_function_in_a_namespace_is_named_by_its_path() -> None:
    bad = {"type": "namespace", "name": "ns", "tools": [{**FN, "name": "bad name"}]}
    assert _refused(lambda: tool_request([FN, bad], None, None)).param == "tools[1].tools[0].name"
    assert _refused(lambda: tool_request([{"type": "namespace", "name": "ns", "tools": "x"}], None, None)).param == "tools[0].tools"
    hosted = {"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}
    assert _refused(lambda: tool_request([hosted], None, None)).param == "tools[0].tools[0].type"
    exc = _refused(lambda: tool_request([{"type": "web_search", "external_web_access": False}], None, None))
    assert 'hosted_tools = "refuse"' in exc.message  # why this server refuses what others skip


def test_served_tools_leave_out_the_hosted_ones_namespaces_included() -> None:
    """What hosted_tools = "skip" offers the model: functions, and each namespace's functions;
    every other type is left out and named, in order (issue 41, item 6)."""
    ns = {"type": "namespace", "name": "ns", "tools": [{"type": "mcp"}, FN]}
    only_hosted = {"type": "namespace", "name": "web", "tools": [{"type": "web_search"}]}
    kept, skipped = served_tools([{"type": "web_search"}, FN, ns, only_hosted, {"type": "custom", "name": "apply_patch"}])
    assert kept == [FN, {**ns, "tools": [FN]}]
    assert skipped == ["web_search", "mcp", "web_search", "custom"]
    # Not objects, or a namespace without a list: kept, for tool_request's 400.
    assert served_tools(["x", {"type": "namespace", "tools": "x"}]) == (["x", {"type": "namespace", "tools": "x"}], [])
    assert served_tools(None) == (None, [])
    assert served_tools([{"type": 7}]) == ([], ["7"])


@pytest.mark.parametrize(
    "body, param",
    [
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"top_logprobs": 3}, "top_logprobs"),
    ],
)
def test_what_corral_cannot_keep_is_refused_not_ignored(body: dict[str, Any], param: str) -> None:
    assert _refused(lambda: refuse_unserved(request(input="x", **body))).param == param


def test_sampling_ranges_name_the_responses_parameter() -> None:
    r = request(input="x", max_output_tokens=0)
    assert _refused(lambda: responses_job(r, "m", SamplingParams(), (), NO_TOOLS)).param == "max_output_tokens"
    r = request(input="x", temperature=3)
    assert _refused(lambda: responses_job(r, "m", SamplingParams(), (), NO_TOOLS)).param == "temperature"
    r = request(input="x", text={"format": {"type": "json_schema", "name": "x"}})
    assert _refused(lambda: responses_job(r, "m", SamplingParams(), (), NO_TOOLS)).param == "text.format.schema"


def test_an_input_image_is_a_marker_in_its_users_text_and_its_bytes() -> None:
    out = chat_messages([{"role": "user", "content": [
        {"type": "input_text", "text": "what is "},
        {"type": "input_image", "image_url": "data:image/png;base64,aGk=", "detail": "auto"},
        {"type": "input_text", "text": "?"},
    ]}])
    assert out == [ChatMessage(role="user", content=f"what is {MEDIA_MARKER}?", media=[
        Media(data=b"hi", param="input[0].content[1].image_url")])]


def test_a_function_outputs_images_go_with_it_and_detail_is_checked() -> None:
    out = chat_messages([
        {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "here:"}, {"type": "input_image", "image_url": "data:image/png;base64,aGk="}]},
    ])
    assert out[1] == ChatMessage(role="tool", content=f"here:{MEDIA_MARKER}", tool_call_id="c1",
                                 media=[Media(data=b"hi", param="input[1].output[1].image_url")])
    with pytest.raises(InvalidRequest) as info:
        chat_messages([{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,aGk=", "detail": "x"}]}])
    assert info.value.param == "input[0].content[0].detail"
