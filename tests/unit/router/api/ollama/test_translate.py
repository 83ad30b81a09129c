"""router/api/ollama/translate.py: Ollama's bodies into the internal request, each bad
input a 400 naming it (Ollama's docs/api.md and api/types.go are the reference)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from router.api.ollama.schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaOptions
from router.api.ollama.translate import chat_job, generate_job, keep_alive, messages, sampling_params
from router.generation import structured
from router.generation.job import KeepAlive
from router.generation.structured import ANY_OBJECT
from router.server.json_body import decode
from supervisor.errors import CorralError, InvalidRequest, Unsupported
from worker.protocol import MEDIA_MARKER, ChatMessage, Media, SamplingParams, ToolCall


def chat(**body: Any) -> OllamaChatRequest:
    r: OllamaChatRequest = decode(json.dumps({"model": "m", **body}).encode(), OllamaChatRequest)
    return r


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None), (0, 0.0), (0.0, 0.0), (300, 300.0), (-1, -1.0), ("5m", 300.0), ("1h30m", 5400.0),
        ("300ms", 0.3), ("1.5s", 1.5), ("-1m", -60.0), ("0", 0.0), ("2h", 7200.0),
    ],
)
def test_keep_alive_takes_seconds_and_go_durations(value: Any, seconds: float | None) -> None:
    assert keep_alive(value) == KeepAlive(seconds)


@pytest.mark.parametrize("value", ["300", "5 m", "m", "", "5x", "1h-5m"])
def test_a_keep_alive_that_is_no_duration_is_a_400_naming_it(value: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        keep_alive(value)
    assert exc.value.param == "keep_alive"


def test_options_set_the_samplers_and_the_rest_keep_the_defaults() -> None:
    p = sampling_params(
        OllamaOptions(num_predict=7, temperature=0.0, top_k=5, top_p=0.5, min_p=0.1, repeat_penalty=1.1,
                repeat_last_n=32, presence_penalty=0.5, frequency_penalty=0.25, seed=42, stop=["\n"], num_ctx=99),
        SamplingParams(),
    )
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.min_p) == (7, 0.0, 5, 0.5, 0.1)
    assert (p.repeat_penalty, p.repeat_last_n, p.presence_penalty, p.frequency_penalty) == (1.1, 32, 0.5, 0.25)
    assert (p.seed, p.stop) == (42, ["\n"])
    assert sampling_params(None, SamplingParams(max_tokens=64)) == SamplingParams(max_tokens=64)
    assert sampling_params(OllamaOptions(num_predict=-1, seed=-1), SamplingParams(max_tokens=64)) == SamplingParams(max_tokens=None, seed=None)


def test_the_models_defaults_fill_what_options_leave_unset() -> None:
    """A model's config defaults (llama-server's --temp, --seed, ... ; issue 22 item 1)
    apply to Ollama's options too; an option the request sets wins."""
    model = SamplingParams(max_tokens=9, temperature=0.1, top_k=3, seed=5, stop=["END"], presence_penalty=0.5)
    p = sampling_params(OllamaOptions(top_k=7), model)
    assert (p.max_tokens, p.temperature, p.top_k, p.seed, p.stop, p.presence_penalty) == (9, 0.1, 7, 5, ["END"], 0.5)
    p = sampling_params(OllamaOptions(seed=-1, stop=[], num_predict=2), model)
    assert (p.seed, p.stop, p.max_tokens) == (None, [], 2)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        (OllamaOptions(temperature=3.0), "options.temperature"),
        (OllamaOptions(top_p=1.5), "options.top_p"),
        (OllamaOptions(top_k=-1), "options.top_k"),
        (OllamaOptions(repeat_penalty=0.0), "options.repeat_penalty"),
        (OllamaOptions(num_predict=-3), "options.num_predict"),
        (OllamaOptions(stop=[""]), "options.stop"),
        (OllamaOptions(stop=[str(i) for i in range(17)]), "options.stop"),
        (OllamaOptions(typical_p=0.5), "options.typical_p"),
        (OllamaOptions(mirostat=2), "options.mirostat"),
    ],
)
def test_a_bad_option_is_a_400_naming_it(options: OllamaOptions, param: str) -> None:
    with pytest.raises(CorralError) as exc:
        sampling_params(options, SamplingParams())
    assert exc.value.param == param and param in exc.value.message


def test_an_option_of_the_wrong_type_or_size_is_a_400_naming_it() -> None:
    for body, path in (({"options": {"temperature": "hot"}}, "options.temperature"),
                       ({"options": {"num_predict": 2**40}}, "options.num_predict")):
        with pytest.raises(InvalidRequest) as exc:
            chat(messages=[], **body)
        assert exc.value.param == path


def test_unknown_keys_are_ignored_as_ollama_ignores_them() -> None:
    r = chat(messages=[], tools=[], options={"low_vram": True, "f16_kv": True}, unknown_key=1)
    job = chat_job(r, "m", SamplingParams())
    assert job.tools.offered is None  # the Python client's `tools: []` is no tools
    assert job.stream is True  # stream is on unless a request turns it off


def test_messages_take_thinking_tool_calls_as_objects_and_tool_names() -> None:
    got = messages([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "thinking": "hmm", "tool_calls": [{"function": {"name": "w", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "w"},
        {"role": "Assistant", "content": "Sunny."},
    ])
    assert got == [
        ChatMessage(role="user", content="weather?"),
        ChatMessage(role="assistant", content="", reasoning_content="hmm",
                    tool_calls=[ToolCall(id="call_1_0", name="w", arguments='{"city": "Paris"}')]),
        ChatMessage(role="tool", content="sunny", name="w"),
        ChatMessage(role="assistant", content="Sunny."),
    ]


@pytest.mark.parametrize(
    ("message", "param", "kind"),
    [
        ({"role": "robot", "content": "x"}, "messages[0].role", InvalidRequest),
        ({"role": "user", "content": 7}, "messages[0].content", InvalidRequest),
        ({"role": "user", "content": "x", "images": ["not base64!"]}, "messages[0].images[0]", InvalidRequest),
        ({"role": "user", "content": "x", "images": "aGk="}, "messages[0].images", InvalidRequest),
        ({"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}, "messages[0].tool_calls[0].function.name",
         InvalidRequest),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]},
         "messages[0].tool_calls[0].function.arguments", InvalidRequest),
    ],
)
def test_a_bad_message_is_a_400_naming_its_field(message: dict[str, Any], param: str, kind: type[Exception]) -> None:
    with pytest.raises(kind) as exc:
        messages([message])
    assert getattr(exc.value, "param") == param


def test_format_json_is_any_object_and_a_schema_constrains_as_given() -> None:
    job = chat_job(chat(messages=[{"role": "user", "content": "x"}], format="json"), "m", SamplingParams())
    assert job.params.constraint is not None and job.params.constraint.param == "format"
    # The same grammar as OpenAI's json_object: any one JSON object.
    any_object = structured.constraint([(ANY_OBJECT, "format")])
    assert job.params.constraint == any_object
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    c = chat_job(chat(messages=[], format=schema), "m", SamplingParams()).params.constraint
    assert c is not None and json.loads(c.source)["required"] == ["a"]
    assert chat_job(chat(messages=[], format=""), "m", SamplingParams()).params.constraint is None
    with pytest.raises(InvalidRequest) as exc:
        chat_job(chat(messages=[], format="yaml"), "m", SamplingParams())
    assert exc.value.param == "format"


def test_think_false_turns_thinking_off_and_keep_alive_rides_on_the_job() -> None:
    job = chat_job(chat(messages=[], think=False, keep_alive="10m"), "m", SamplingParams())
    assert job.template_kwargs == {"enable_thinking": False} and job.keep_alive == KeepAlive(600.0)
    assert chat_job(chat(messages=[], think="high"), "m", SamplingParams()).template_kwargs is None
    with pytest.raises(InvalidRequest) as exc:
        chat_job(chat(messages=[], think="very"), "m", SamplingParams())
    assert exc.value.param == "think"


def test_images_stand_where_img_says_else_before_the_text_as_ollama_places_them() -> None:
    [m] = messages([{"role": "user", "content": "compare [img] with this", "images": ["aGk=", "aG8="]}])
    assert m.content == f"{MEDIA_MARKER}compare {MEDIA_MARKER} with this"
    # In the text's order: the image left over (the second) stands first.
    assert m.media == [Media(data=b"ho", param="messages[0].images[1]"), Media(data=b"hi", param="messages[0].images[0]")]


def test_generate_renders_system_and_prompt_as_a_chat_unless_raw() -> None:
    def gen(**body: Any) -> OllamaGenerateRequest:
        r: OllamaGenerateRequest = msgspec.json.decode(json.dumps({"model": "m", **body}), type=OllamaGenerateRequest)
        return r

    job = generate_job(gen(prompt="hi", system="be brief", stream=False), "m", SamplingParams())
    assert job.messages == (ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hi"))
    assert job.stream is False and job.prompt is None
    raw = generate_job(gen(prompt="<s>hi", raw=True), "m", SamplingParams())
    assert raw.messages is None and raw.prompt == "<s>hi"
    for body, param in (({"suffix": "end"}, "suffix"), ({"template": "{{ .Prompt }}"}, "template"),
                        ({"context": [1, 2]}, "context"), ({"images": ["!"]}, "images[0]"),
                        ({"raw": True, "system": "s"}, "system")):
        with pytest.raises(CorralError) as exc:
            generate_job(gen(prompt="x", **body), "m", SamplingParams())
        assert exc.value.param == param


def test_images_are_taken_in_user_messages_only() -> None:
    with pytest.raises(InvalidRequest) as exc:
        messages([{"role": "assistant", "content": "x", "images": ["aGk="]}])
    assert exc.value.param == "messages[0].images"
