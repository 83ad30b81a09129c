"""The internal request written as an OpenAI chat completion for an upstream
(router/generation/remote/outbound.py): only what the client set is sent, since the
upstream's defaults are not Corral's (OpenAI's temperature is 1.0, llama-server's 0.8)
and a hosted API refuses parameters it does not know."""

from __future__ import annotations

from functools import partial
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.api.anthropic import schemas as anthropic
from router.api.anthropic.translate import messages_job
from router.api.ollama.schemas import OllamaChatRequest
from router.api.ollama.translate import chat_job as ollama_chat_job
from router.api.responses.schemas import ResponsesRequest
from router.api.responses.translate import responses_job
from router.generation.job import GenerationJob
from router.generation.tool_schemas import ToolRequest
from router.generation.remote.outbound import chat_body, completion_body, sent_fields
from supervisor.errors import Unsupported
from worker.protocol import MEDIA_MARKER, ChatMessage, Constraint, Media, SamplingParams, ToolCall

SAMPLING_KEYS = {"max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "repeat_penalty",
                 "repeat_last_n", "presence_penalty", "frequency_penalty", "ignore_eos"}


def _anthropic(**fields: Any) -> GenerationJob:
    r = msgspec.convert({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16, **fields},
                        anthropic.MessagesRequest)
    return sent_fields(partial(messages_job, r, "m"))


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k in SAMPLING_KEYS}


@given(
    temperature=st.none() | st.sampled_from([0.0, 0.8, 1.0]),  # 0.8 is Corral's own default
    top_p=st.none() | st.sampled_from([0.5, 0.95]),
    top_k=st.none() | st.sampled_from([1, 40]),
    stop=st.none() | st.sampled_from([["END"], ["a", "b"]]),
)
def test_exactly_the_parameters_the_client_set_are_sent(
    temperature: float | None, top_p: float | None, top_k: int | None, stop: list[str] | None
) -> None:
    given_fields = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "stop_sequences": stop}
    body = chat_body(_anthropic(**{k: v for k, v in given_fields.items() if v is not None}), "up")
    expected = {"max_tokens": 16, **{("stop" if k == "stop_sequences" else k): v
                                     for k, v in given_fields.items() if v is not None}}
    assert _sampling(body) == expected


def test_the_other_dialects_translators_are_read_the_same_way() -> None:
    r = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                         "options": {"num_predict": -1, "seed": 5, "min_p": 0.05, "repeat_penalty": 1.1}},
                        OllamaChatRequest)
    body = chat_body(sent_fields(partial(ollama_chat_job, r, "m")), "up")
    # num_predict -1 is "no limit": the client set it, to nothing, so no max_tokens goes.
    assert _sampling(body) == {"seed": 5, "min_p": 0.05, "repeat_penalty": 1.1}
    rr = msgspec.convert({"model": "m", "input": "Hi", "max_output_tokens": 9, "temperature": 0.3}, ResponsesRequest)
    job = sent_fields(lambda d: responses_job(rr, "m", d, (ChatMessage(role="user", content="Hi"),), ToolRequest()))
    assert _sampling(chat_body(job, "up")) == {"max_tokens": 9, "temperature": 0.3}


def test_the_body_is_a_streamed_chat_completion_with_usage() -> None:
    body = chat_body(_anthropic(system="Be brief.", thinking={"type": "disabled"}), "name-there")
    assert body["model"] == "name-there"
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def _job(params: SamplingParams = SamplingParams(), sent: frozenset[str] = frozenset(), **fields: Any) -> GenerationJob:
    return GenerationJob(model="m", params=params, messages=(ChatMessage(role="user", content="x"),), sent=sent, **fields)


def test_tools_and_tool_choice_keep_their_meaning() -> None:
    fns = tuple({"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("a", "b"))
    auto = chat_body(_job(tools=ToolRequest(offered=fns)), "up")
    assert auto["tools"] == list(fns) and "tool_choice" not in auto and "parallel_tool_calls" not in auto
    required = chat_body(_job(tools=ToolRequest(offered=fns, forced=fns, parallel=False)), "up")
    assert required["tool_choice"] == "required" and required["parallel_tool_calls"] is False
    named = chat_body(_job(tools=ToolRequest(offered=fns, forced=fns[1:])), "up")
    assert named["tool_choice"] == {"type": "function", "function": {"name": "b"}}
    assert "tools" not in chat_body(_job(tools=ToolRequest()), "up")  # tool_choice none: nothing offered


def test_a_conversation_with_calls_and_results_is_written_as_openai_messages() -> None:
    turns = (
        ChatMessage(role="user", content="Weather?"),
        ChatMessage(role="assistant", tool_calls=[ToolCall(id="c1", name="w", arguments='{"city": "Oslo"}')],
                    reasoning_content="Look it up."),
        ChatMessage(role="tool", content="cold", tool_call_id="c1"),
    )
    job = GenerationJob(model="m", params=SamplingParams(), messages=turns, sent=frozenset())
    assert chat_body(job, "up")["messages"] == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "reasoning_content": "Look it up.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "content": "cold", "tool_call_id": "c1"},
    ]


def test_constraints_go_as_the_upstream_reads_them_or_are_refused_naming_their_parameter() -> None:
    schema = Constraint(kind="json_schema", source='{"type": "object"}', param="output_format", given='{"type": "object"}')
    body = chat_body(_job(params=SamplingParams(constraint=schema)), "up")
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    gbnf = Constraint(kind="gbnf", source='root ::= "a"', param="grammar")
    assert chat_body(_job(params=SamplingParams(constraint=gbnf)), "up")["grammar"] == 'root ::= "a"'
    lark = Constraint(kind="lark", source="start: /a/", param="format")
    with pytest.raises(Unsupported) as refused:
        chat_body(_job(params=SamplingParams(constraint=lark)), "up")
    assert refused.value.param == "format"
    with pytest.raises(Unsupported) as biased:
        chat_body(_job(params=SamplingParams(logit_bias={5: 1.0}), sent=frozenset({"logit_bias"})), "up")
    assert biased.value.param == "logit_bias"


def test_a_text_prompt_is_a_text_completion_and_token_prompts_are_refused() -> None:
    job = GenerationJob(model="m", params=SamplingParams(max_tokens=4), prompt="Once", sent=frozenset({"max_tokens"}))
    body = completion_body(job, "up")
    assert (body["prompt"], body["max_tokens"], body["stream"]) == ("Once", 4, True)
    with pytest.raises(Unsupported):
        completion_body(GenerationJob(model="m", params=SamplingParams(), prompt_list=((1, 2),)), "up")


def test_an_ollama_tool_result_gets_the_id_of_the_call_it_answers() -> None:
    """Found by probing the front: Ollama's tool results carry the tool's name, not the
    call's id, and OpenAI's API refuses a tool message without one."""
    turns = (
        ChatMessage(role="user", content="?"),
        ChatMessage(role="assistant", tool_calls=[ToolCall(id="c1", name="a", arguments="{}"),
                                                  ToolCall(id="c2", name="b", arguments="{}")]),
        ChatMessage(role="tool", content="B", name="b"),
        ChatMessage(role="tool", content="A"),
    )
    sent = chat_body(GenerationJob(model="m", params=SamplingParams(), messages=turns, sent=frozenset()), "up")
    assert [(m["content"], m["tool_call_id"]) for m in sent["messages"][2:]] == [("B", "c2"), ("A", "c1")]


def test_json_mode_is_json_mode_and_no_schema_is_made_strict() -> None:
    r = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "format": "json"},
                        OllamaChatRequest)
    assert chat_body(sent_fields(partial(ollama_chat_job, r, "m")), "up")["response_format"] == {"type": "json_object"}
    job = _anthropic(output_format={"type": "json_schema", "schema": {"type": "object", "properties": {"a": {}}}})
    assert "strict" not in chat_body(job, "up")["response_format"]["json_schema"]


def test_the_schema_sent_is_the_clients_not_the_one_narrowed_for_a_worker() -> None:
    schema = {"type": "object", "properties": {"i": {"type": "integer"}}}
    job = _anthropic(output_config={"format": {"type": "json_schema", "schema": schema}})
    assert chat_body(job, "up")["response_format"]["json_schema"]["schema"] == schema


def test_tool_choice_none_is_sent_with_the_tools_as_the_client_sent_it() -> None:
    fn = {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}
    body = chat_body(_job(tools=ToolRequest(withheld=(fn,))), "up")
    assert (body["tools"], body["tool_choice"]) == ([fn], "none")


def test_a_reasoning_effort_goes_as_openais_reasoning_effort() -> None:
    rr = msgspec.convert({"model": "m", "input": "Hi", "reasoning": {"effort": "low"}}, ResponsesRequest)
    job = sent_fields(lambda d: responses_job(rr, "m", d, (ChatMessage(role="user", content="Hi"),), ToolRequest()))
    assert chat_body(job, "up")["reasoning_effort"] == "low"
    off = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "think": False}, OllamaChatRequest)
    body = chat_body(sent_fields(partial(ollama_chat_job, off, "m")), "up")
    assert "reasoning_effort" not in body and body["chat_template_kwargs"] == {"enable_thinking": False}


def test_a_clients_schema_that_is_any_object_goes_as_its_schema() -> None:
    """OpenAI's JSON mode asks the messages to say "json" (a 400 otherwise): a schema the
    client gave must go as that schema, even the schema of any object."""
    job = _anthropic(output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}})
    fmt = chat_body(job, "up")["response_format"]
    assert fmt == {"type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "object"}}}
    r = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "format": "json"}, OllamaChatRequest)
    assert chat_body(sent_fields(partial(ollama_chat_job, r, "m")), "up")["response_format"] == {"type": "json_object"}


def test_images_and_audio_go_as_openai_parts_and_audio_it_cannot_take_is_refused() -> None:
    wav, flac = b"RIFF\x24\x00\x00\x00WAVEfmt ", b"fLaC\x00\x00\x00\x22"
    turn = ChatMessage(role="user", content=f"a{MEDIA_MARKER}b", media=[Media(data=wav, param="p", kind="audio")])
    body = chat_body(GenerationJob(model="m", params=SamplingParams(), messages=(turn,), sent=frozenset()), "up")
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "a"}, {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZFZm10IA==", "format": "wav"}},
        {"type": "text", "text": "b"},
    ]
    turn = ChatMessage(role="user", content=f"a{MEDIA_MARKER}", media=[Media(data=flac, param="file", kind="audio")])
    with pytest.raises(Unsupported) as info:
        chat_body(GenerationJob(model="m", params=SamplingParams(), messages=(turn,), sent=frozenset()), "up")
    assert info.value.param == "file" and "FLAC" in info.value.message


def test_a_requests_lora_is_passed_on_as_sent() -> None:
    """llama-server's per-request `lora` on a model served elsewhere: the ids are the
    upstream's adapters, so they go as the client sent them (issue 45)."""
    job = GenerationJob(model="m", params=SamplingParams(), messages=(ChatMessage(role="user", content="x"),),
                        lora=((0, 0.5), (2, 1.0)))
    assert chat_body(job, "up")["lora"] == [{"id": 0, "scale": 0.5}, {"id": 2, "scale": 1.0}]
    text = GenerationJob(model="m", params=SamplingParams(), prompt="x", lora=((1, 1.0),))
    assert completion_body(text, "up")["lora"] == [{"id": 1, "scale": 1.0}]
    assert "lora" not in chat_body(GenerationJob(model="m", params=SamplingParams(), messages=job.messages), "up")
