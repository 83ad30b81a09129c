"""The internal request written as an Anthropic Messages request, for an upstream that
speaks only Anthropic's API (router/generation/remote/anthropic_request.py). The shapes
are the Messages API reference's (docs.anthropic.com/en/api/messages): `system` at the
top, tool_use and tool_result blocks, `max_tokens` required, `output_config.format` for
a JSON schema; what it has no counterpart for is a 400 naming the parameter."""

from __future__ import annotations

from functools import partial
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.api.ollama.schemas import OllamaChatRequest
from router.api.ollama.translate import chat_job as ollama_chat_job
from router.api.openai.schemas import ChatRequest
from router.api.openai.translate import chat_job
from router.generation.job import GenerationJob
from router.generation.remote.anthropic_request import DEFAULT_MAX_TOKENS, messages_body
from router.generation.remote.outbound import sent_fields
from router.generation.tool_schemas import ToolRequest
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import MEDIA_MARKER, ChatMessage, Constraint, Media, SamplingParams, ToolCall

SAMPLING_KEYS = {"max_tokens", "temperature", "top_p", "top_k", "stop_sequences"}


def _openai(**fields: Any) -> GenerationJob:
    r = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}, ChatRequest)
    return sent_fields(partial(chat_job, r, "m"))


def _job(params: SamplingParams = SamplingParams(), sent: frozenset[str] = frozenset(), **fields: Any) -> GenerationJob:
    return GenerationJob(model="m", params=params, messages=(ChatMessage(role="user", content="x"),), sent=sent, **fields)


@given(
    temperature=st.none() | st.sampled_from([0.0, 0.8, 1.0]),
    top_p=st.none() | st.sampled_from([0.5, 0.95]),
    max_tokens=st.none() | st.sampled_from([1, 300]),
    stop=st.none() | st.sampled_from([["END"], ["a", "b"]]),
)
def test_exactly_the_parameters_the_client_set_are_sent_and_max_tokens_always(
    temperature: float | None, top_p: float | None, max_tokens: int | None, stop: list[str] | None
) -> None:
    given_fields = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "stop": stop}
    body = messages_body(_openai(**{k: v for k, v in given_fields.items() if v is not None}), "claude-x")
    expected = {("stop_sequences" if k == "stop" else k): v for k, v in given_fields.items() if v is not None}
    expected.setdefault("max_tokens", DEFAULT_MAX_TOKENS)  # required by the Messages API
    assert {k: v for k, v in body.items() if k in SAMPLING_KEYS} == expected
    assert body["model"] == "claude-x" and body["stream"] is True


def test_system_messages_go_to_the_top_and_turns_of_one_role_are_one_turn() -> None:
    job = _openai(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "user", "content": "Again"},
        {"role": "developer", "content": "No lists."},
        {"role": "assistant", "content": "Hello."},
    ])
    body = messages_body(job, "c")
    assert body["system"] == "Be brief.\n\nNo lists."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "Again"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
    ]


def test_calls_and_results_are_tool_use_and_tool_result_blocks() -> None:
    turns = (
        ChatMessage(role="user", content="Weather in Oslo and Rome?"),
        ChatMessage(role="assistant", content="Looking.", reasoning_content="Two calls.", tool_calls=[
            ToolCall(id="c1", name="w", arguments='{"city": "Oslo"}'), ToolCall(id="c2", name="w", arguments="")]),
        ChatMessage(role="tool", content="cold", tool_call_id="c1"),
        ChatMessage(role="tool", content="warm", name="w"),  # Ollama's: no call id
        ChatMessage(role="user", content="Thanks"),
    )
    body = messages_body(GenerationJob(model="m", params=SamplingParams(), messages=turns, sent=frozenset()), "c")
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo and Rome?"}]},
        # Reasoning is not sent back: a thinking block needs Anthropic's own signature.
        {"role": "assistant", "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "c1", "name": "w", "input": {"city": "Oslo"}},
            {"type": "tool_use", "id": "c2", "name": "w", "input": {}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "cold"},
            {"type": "tool_result", "tool_use_id": "c2", "content": "warm"},
            {"type": "text", "text": "Thanks"},
        ]},
    ]


def test_arguments_that_are_not_an_object_are_refused_naming_them() -> None:
    turns = (ChatMessage(role="user", content="?"),
             ChatMessage(role="assistant", tool_calls=[ToolCall(id="c1", name="w", arguments="[1, 2]")]))
    with pytest.raises(InvalidRequest) as refused:
        messages_body(GenerationJob(model="m", params=SamplingParams(), messages=turns, sent=frozenset()), "c")
    assert refused.value.param == "messages[1].tool_calls[0].function.arguments"


def test_arguments_nested_50000_deep_are_refused_as_not_an_object() -> None:
    """A 400 naming them, as for any arguments that are not a JSON object; json.loads's
    RecursionError made it a 500 (router/server/json_text.py)."""
    deep = "[" * 50_000 + "]" * 50_000
    turns = (ChatMessage(role="user", content="?"),
             ChatMessage(role="assistant", tool_calls=[ToolCall(id="c1", name="w", arguments=deep)]))
    with pytest.raises(InvalidRequest) as refused:
        messages_body(GenerationJob(model="m", params=SamplingParams(), messages=turns, sent=frozenset()), "c")
    assert refused.value.param == "messages[1].tool_calls[0].function.arguments"


def test_tools_and_tool_choice_keep_their_meaning() -> None:
    fns = tuple(
        {"type": "function", "function": {"name": n, "description": f"does {n}", "parameters": {"type": "object"}}}
        for n in ("a", "b")
    )
    auto = messages_body(_job(tools=ToolRequest(offered=fns)), "c")
    assert auto["tools"] == [{"name": n, "description": f"does {n}", "input_schema": {"type": "object"}} for n in "ab"]
    assert "tool_choice" not in auto
    required = messages_body(_job(tools=ToolRequest(offered=fns, forced=fns, parallel=False)), "c")
    assert required["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    named = messages_body(_job(tools=ToolRequest(offered=fns, forced=fns[1:])), "c")
    assert named["tool_choice"] == {"type": "tool", "name": "b"}
    serial = messages_body(_job(tools=ToolRequest(offered=fns, parallel=False)), "c")
    assert serial["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    bare = {"type": "function", "function": {"name": "x"}}
    assert messages_body(_job(tools=ToolRequest(offered=(bare,))), "c")["tools"] == [
        {"name": "x", "input_schema": {"type": "object"}}
    ]


def test_a_schema_is_output_config_and_what_has_no_counterpart_is_refused_naming_it() -> None:
    schema = Constraint(kind="json_schema", source='{"type": "object", "properties": {"a": {}}}', param="response_format",
                        given='{"type": "object", "properties": {"a": {}}}')
    body = messages_body(_job(params=SamplingParams(constraint=schema)), "c")
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {}}}}}
    for fields, param in (
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"seed": 3}, "seed"),
        ({"n": 2}, "n"),
        ({"min_p": 0.1}, "min_p"),
        ({"grammar": 'root ::= "a"'}, "grammar"),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
        ({"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs"),
    ):
        with pytest.raises(Unsupported) as refused:
            messages_body(_openai(**fields), "c")
        assert refused.value.param == param, fields


def test_neutral_values_of_what_anthropic_lacks_are_dropped_not_refused() -> None:
    """Clients that send every field at its neutral value (presence_penalty 0, an agent
    framework's defaults) must not be refused for asking nothing."""
    body = messages_body(_openai(presence_penalty=0, frequency_penalty=0, n=1, min_p=0), "c")
    assert not {"presence_penalty", "frequency_penalty", "n", "min_p"} & body.keys()
    r = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "think": False}, OllamaChatRequest)
    assert "thinking" not in messages_body(sent_fields(partial(ollama_chat_job, r, "m")), "c")


def test_a_text_prompt_is_refused_naming_it() -> None:
    with pytest.raises(Unsupported) as refused:
        messages_body(GenerationJob(model="m", params=SamplingParams(), prompt="Once"), "c")
    assert refused.value.param == "prompt"


def test_the_schema_sent_is_the_clients_not_the_one_narrowed_for_a_worker() -> None:
    """Found by probing: the router narrows a schema for the worker's grammar (integers
    bounded, objects closed, `multipleOf` on numbers), which Anthropic's structured
    outputs refuse (no numeric bounds) and which asks more than the client did."""
    schema = {"type": "object", "properties": {"n": {"type": "number"}, "i": {"type": "integer"}},
              "additionalProperties": True}
    body = messages_body(_openai(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}), "c")
    assert body["output_config"]["format"]["schema"] == schema


def test_tool_choice_none_sends_the_tools_with_anthropics_none() -> None:
    """Found by probing: tool_choice "none" left the tools out, and Anthropic's API
    refuses a conversation with tool_use blocks and no tools, so the usual last turn of a
    tool loop (answer now, with the results) was a 400. A history with calls and no tools
    at all, which OpenAI's API takes, gets the called tools by name."""
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cold"},
    ]
    fn = {"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {}}}}
    body = messages_body(_openai(messages=history, tools=[fn], tool_choice="none"), "c")
    assert body["tools"] == [{"name": "w", "input_schema": {"type": "object", "properties": {}}}]
    assert body["tool_choice"] == {"type": "none"}
    bare = messages_body(_openai(messages=history), "c")
    assert (bare["tools"], bare["tool_choice"]) == ([{"name": "w", "input_schema": {"type": "object"}}], {"type": "none"})
    assert "tools" not in messages_body(_openai(), "c")


def test_a_reasoning_effort_is_extended_thinking_within_max_tokens() -> None:
    """Found by probing: reasoning_effort, Responses' reasoning.effort and Ollama's think
    reached the upstream as nothing, though Anthropic's API has extended thinking; LiteLLM
    maps the efforts to budgets of 1024, 2048 and 4096 tokens."""
    assert "thinking" not in messages_body(_openai(), "c")
    assert "thinking" not in messages_body(_openai(reasoning_effort="none"), "c")
    high = messages_body(_openai(reasoning_effort="high"), "c")
    assert high["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert high["max_tokens"] == 4096 + DEFAULT_MAX_TOKENS  # the answer keeps its room
    low = messages_body(_openai(reasoning_effort="low", max_tokens=3000), "c")
    assert (low["thinking"]["budget_tokens"], low["max_tokens"]) == (1024, 3000)
    with pytest.raises(Unsupported) as refused:
        messages_body(_openai(reasoning_effort="medium", max_tokens=2048), "c")
    assert refused.value.param == "max_tokens"
    for think, budget in ((True, 2048), ("high", 4096), ("max", 8192)):
        r = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "think": think},
                            OllamaChatRequest)
        assert messages_body(sent_fields(partial(ollama_chat_job, r, "m")), "c")["thinking"]["budget_tokens"] == budget


def test_a_clients_schema_that_is_any_object_is_a_schema_not_json_mode() -> None:
    """Found by probing: `{"type": "object"}` as the client's own schema was taken for JSON
    mode (the same constraint once narrowed) and refused as "JSON mode without a schema"."""
    plain = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert messages_body(_openai(response_format=plain), "c")["output_config"]["format"]["schema"] == {"type": "object"}
    with pytest.raises(Unsupported):
        messages_body(_openai(response_format={"type": "json_object"}), "c")


def test_what_extended_thinking_refuses_beside_it_is_refused_here_naming_it() -> None:
    """Anthropic's extended thinking docs: no forced tool use, no temperature or top_k
    changes, top_p 0.95 to 1. Found by probing: these went upstream and came back as its
    400 naming no parameter; an effort OpenAI does not know passed as no thinking."""
    fn = {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
    for fields, param in (
        ({"tools": [fn], "tool_choice": "required"}, "tool_choice"),
        ({"temperature": 0.5}, "temperature"),
        ({"top_k": 5}, "top_k"),
        ({"top_p": 0.5}, "top_p"),
        ({"reasoning_effort": "bogus"}, "reasoning_effort"),
    ):
        with pytest.raises((Unsupported, InvalidRequest)) as refused:
            messages_body(_openai(**{"reasoning_effort": "low", "max_tokens": 3000, **fields}), "c")
        assert refused.value.param == param, fields
    ok = messages_body(_openai(reasoning_effort="low", temperature=1, top_p=0.97, tools=[fn]), "c")
    assert ok["thinking"]["budget_tokens"] == 1024 and ok["temperature"] == 1


def test_audio_cannot_go_to_an_anthropic_upstream() -> None:
    turn = ChatMessage(role="user", content=f"hear {MEDIA_MARKER}", media=[Media(data=b"RIFF", param="messages[0].content[1].input_audio.data", kind="audio")])
    with pytest.raises(Unsupported) as info:
        messages_body(GenerationJob(model="m", params=SamplingParams(), messages=(turn,), sent=frozenset()), "up")
    assert info.value.param == "messages[0].content[1].input_audio.data" and "takes no audio" in info.value.message


def test_a_requests_lora_is_refused_by_name_for_anthropics_api() -> None:
    """Anthropic's Messages API has no adapters: a `lora` the client sent is not dropped."""
    with pytest.raises(Unsupported) as info:
        messages_body(_job(lora=((0, 1.0),)), "claude-x")
    assert info.value.param == "lora"
