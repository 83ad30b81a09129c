"""Tool calling and assistant prefill with the demo model, through the openai client with
strict response validation.

The demo model (gemma-3 270M) runs on the built-in "gemma" template with tool_format =
"generic": tools are offered in a system message and a call is a JSON object. A forced
call (tool_choice "required" or named) relies on the worker enforcing the constraint the
router sends; without that engine a 270M model does not reliably write the JSON, and
those tests fail rather than skip.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import jsonschema
import openai
import pydantic
import pytest

from tests.e2e.conftest import Server, pooled_briefly, start_server, stop_server

CONFIG = """
[server]
port = {PORT}

[supervisor]
idle_timeout = 0

[models.tools]
path = "{MODEL}"
slots = 2
n_ctx = 2048
chat_template = "gemma"
tool_format = "generic"

[models.plain]
path = "{MODEL}"
slots = 1
n_ctx = 1024
chat_template = "gemma"
"""

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city", "parameters": WEATHER_SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "description": "The local time in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 80}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("tools"), CONFIG)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, http_client=pooled_briefly(), _strict_response_validation=True)


def conforms(value: Any, schema: dict[str, Any]) -> list[str]:
    """Where `value` breaks `schema`, by the jsonschema package's full validator."""
    return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(value)]


# One call, where a test needs exactly one. With parallel calls allowed the demo model
# writes several; tests/e2e/test_forced_tool_calls.py covers that (issue 20).
ONE_CALL: dict[str, Any] = {"parallel_tool_calls": False}


def test_required_tool_choice_returns_a_valid_call(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tools", messages=ASK, tools=TOOLS, tool_choice="required", **ONE_CALL, **GREEDY
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in ("get_weather", "get_time")
        args = json.loads(call.function.arguments)
        schema = TOOLS[0 if call.function.name == "get_weather" else 1]["function"]["parameters"]
        assert conforms(args, schema) == []


def test_named_tool_choice_calls_that_function_once(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tools",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
        **GREEDY,
    )
    calls = r.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "get_time"
    args = json.loads(calls[0].function.arguments)
    assert conforms(args, TOOLS[1]["function"]["parameters"]) == []
    # get_time's schema leaves additionalProperties unsaid: no key it does not declare, as
    # llama-server (the demo model wrote several invented keys before objects were closed)
    assert set(args) == {"city"}


class Place(pydantic.BaseModel):
    city: str
    country: str


class Booking(pydantic.BaseModel):
    place: Place
    nights: int


def test_a_pydantic_tool_with_nested_models_is_called(client: openai.OpenAI) -> None:
    # The openai SDK's own helper writes the nested model as a $ref into $defs; the forced
    # call's grammar failed to compile on it (a 400) before refs moved with the schema.
    tool = openai.pydantic_function_tool(Booking)
    assert "$defs" in json.dumps(tool["function"]["parameters"])
    r = client.chat.completions.create(
        model="tools",
        messages=[{"role": "user", "content": "Book two nights in Paris."}],
        tools=[tool],
        tool_choice="required",
        **ONE_CALL,
        **GREEDY,
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls is not None and len(calls) == 1
    assert calls[0].function.name == "Booking"
    assert conforms(json.loads(calls[0].function.arguments), tool["function"]["parameters"]) == []
    Booking.model_validate_json(calls[0].function.arguments)  # what the client's code would do


def test_streamed_call_has_openai_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tools", messages=ASK, tools=TOOLS, tool_choice="required", stream=True, **ONE_CALL, **GREEDY
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            if tc.index not in calls:
                # The first delta of a call carries its id, type and name.
                assert tc.id and tc.type == "function" and tc.function and tc.function.name
                calls[tc.index] = {"name": tc.function.name, "arguments": tc.function.arguments or ""}
            else:
                assert tc.function is not None and tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls and sorted(calls) == list(range(len(calls)))
    for c in calls.values():
        assert isinstance(json.loads(c["arguments"]), dict)


def test_tool_choice_none_answers_in_content(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tools", messages=ASK, tools=TOOLS, tool_choice="none", **GREEDY)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length")


def test_history_with_calls_and_results_renders(client: openai.OpenAI) -> None:
    messages: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"},
    ]
    r = client.chat.completions.create(model="tools", messages=messages, tools=TOOLS, **GREEDY)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tools_on_a_builtin_template_are_offered_in_the_generic_format(server: Server) -> None:
    """Issue 20, item 3: a 400 naming `tools` until tool_format = "generic" was set; the
    generic format is now what a template without its own takes, as in llama-server."""
    r = httpx.post(
        server.base + "/chat/completions",
        json={"model": "plain", "messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 80},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_bad_tool_choice_is_a_400(server: Server) -> None:
    r = httpx.post(
        server.base + "/chat/completions",
        json={"model": "tools", "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


def test_assistant_prefill_is_continued(client: openai.OpenAI, server: Server) -> None:
    prefill = "The capital of France is"
    messages: list[Any] = [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": prefill}]
    r = client.chat.completions.create(model="plain", messages=messages, **GREEDY)
    text = r.choices[0].message.content or ""
    # A continuation, not a new answer: it does not repeat the prefill's start.
    assert text and not text.lstrip().startswith(prefill)
    tokens = httpx.post(server.url + "/tokenize", json={"model": "plain", "content": "x"}, timeout=60)
    assert tokens.status_code == 200  # the worker is still serving
    two = httpx.post(
        server.base + "/chat/completions",
        json={"model": "plain", "messages": [*messages, {"role": "assistant", "content": "Paris"}]},
        timeout=60,
    )
    assert two.status_code == 400 and two.json()["error"]["param"] == "messages"


def test_apply_template_with_tools_is_the_prompt_a_chat_with_them_gets(server: Server, client: openai.OpenAI) -> None:
    # llama-server's /apply-template reads a chat body: tools shape the prompt too.
    body = {"model": "tools", "messages": ASK, "tools": TOOLS}
    r = httpx.post(server.url + "/apply-template", json=body, timeout=60)
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "get_weather" in prompt and "get_time" in prompt
    plain = httpx.post(server.url + "/apply-template", json={"model": "tools", "messages": ASK}, timeout=60).json()["prompt"]
    assert "get_weather" not in plain
    # The same prompt, token for token, as the chat request's.
    tokens = httpx.post(server.url + "/tokenize", json={"model": "tools", "content": prompt, "add_special": True}, timeout=60)
    chat = client.chat.completions.create(model="tools", messages=ASK, tools=TOOLS, max_tokens=1)
    assert chat.usage is not None and chat.usage.prompt_tokens == len(tokens.json()["tokens"])
    # tool_choice "none" offers none, as in a chat
    none = httpx.post(server.url + "/apply-template", json={**body, "tool_choice": "none"}, timeout=60).json()["prompt"]
    assert none == plain


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tools", "messages": ASK, "tools": [{"type": "function"}]}, "tools[0].function"),
        ({"model": "tools", "messages": ASK, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    ],
)
def test_apply_template_refuses_what_a_chat_refuses(server: Server, body: dict[str, Any], param: str) -> None:
    r = httpx.post(server.url + "/apply-template", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param  # llama-server's error shape on its own route
    assert r.json()["error"]["code"] == 400
