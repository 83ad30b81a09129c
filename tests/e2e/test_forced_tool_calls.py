"""Issue 20, items 2 and 3, on the stock examples/config.toml with the demo model, through
the openai client with strict response validation.

On 8ad3c96 the stock config refused any request with tools (400: its built-in "gemma"
template needs tool_format = "generic"); with that set, tool_choice "required" and the
default parallel_tool_calls made the demo model write call after call until max_tokens,
all returned as content with tool_calls null and finish_reason "length"; and JSON numbers
ran on in digits until max_tokens.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.conftest import Server, pooled_briefly

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit"],
}
TIME: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The local time in a city", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(stock_server: Server) -> Server:
    return stock_server


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, http_client=pooled_briefly(), _strict_response_validation=True)


def valid_calls(calls: list[Any]) -> None:
    """Each call names a declared function, and its arguments validate against its schema."""
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        schema = SCHEMAS[call.function.name]
        args = json.loads(call.function.arguments)
        assert [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(args)] == []


def test_the_stock_config_takes_tools_in_the_generic_format(client: openai.OpenAI, server: Server) -> None:
    """Item 3: a 400 on 8ad3c96; now answered, and the worker said once why."""
    r = client.chat.completions.create(model="gemma", messages=ASK, tools=TOOLS, max_tokens=40)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    lines = [line for line in server.log_text().splitlines() if "generic JSON format" in line]
    assert len(lines) == 1, lines


def test_required_tool_choice_with_default_parallel_calls_returns_calls_ten_times_out_of_ten(
    client: openai.OpenAI,
) -> None:
    """The acceptance: the openai client's defaults (its temperature, parallel_tool_calls
    unset), the stock config's max_tokens."""
    for _ in range(10):
        r = client.chat.completions.create(model="gemma", messages=ASK, tools=TOOLS, tool_choice="required")
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", (choice.message.content or "")[:200]
        assert choice.message.content is None
        valid_calls(choice.message.tool_calls or [])
        # No call repeats another: a repeat ends the calls (router/generation/chat_output.py).
        keys = [(c.function.name, json.dumps(json.loads(c.function.arguments), sort_keys=True))
                for c in choice.message.tool_calls or []]
        assert len(keys) == len(set(keys))


def test_a_forced_stream_assembles_into_the_same_kind_of_calls(client: openai.OpenAI) -> None:
    for _ in range(3):
        stream = client.chat.completions.create(
            model="gemma", messages=ASK, tools=TOOLS, tool_choice="required", stream=True,
            stream_options={"include_usage": True},
        )
        calls: dict[int, dict[str, str]] = {}
        finish, content, usage = None, "", None
        for chunk in stream:
            usage = chunk.usage or usage
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.function and tc.function.name
                    calls[tc.index] = {"name": tc.function.name, "arguments": tc.function.arguments or ""}
                else:
                    assert tc.function is not None
                    calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls" and content == ""
        assert sorted(calls) == list(range(len(calls))) and calls
        for c in calls.values():
            args = json.loads(c["arguments"])
            assert list(jsonschema.Draft202012Validator(SCHEMAS[c["name"]]).iter_errors(args)) == []
        assert usage is not None and usage.completion_tokens > 0


def test_a_named_function_with_default_parallel_calls(client: openai.OpenAI) -> None:
    # Seeded: at the default temperature about 1 request in 80 samples a `city` string that
    # runs to max_tokens, which is "length" with the cut call dropped (as designed, and
    # tested below), and made this test fail one run in 25.
    for seed in range(3):
        r = client.chat.completions.create(
            model="gemma", messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
            seed=seed,
        )
        assert r.choices[0].finish_reason == "tool_calls"
        calls = r.choices[0].message.tool_calls or []
        valid_calls(calls)
        assert {c.function.name for c in calls} == {"get_time"}


def test_max_tokens_keeps_the_whole_calls_and_drops_the_one_it_cut(client: openai.OpenAI) -> None:
    """Greedy, uncut: two calls. Cut inside the second: the first alone, still
    "tool_calls". Cut inside the first: "length", and no half call as content."""
    whole = client.chat.completions.create(
        model="gemma", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, logprobs=True,
    )
    calls = whole.choices[0].message.tool_calls or []
    assert len(calls) >= 2, "the demo model's greedy answer has two calls (c/f units)"
    # The token at which the first call's object closes, from the tokens' own text.
    assert whole.choices[0].logprobs is not None and whole.choices[0].logprobs.content is not None
    text, first_end = "", None
    for i, lp in enumerate(whole.choices[0].logprobs.content):
        text += lp.token
        if first_end is None and text.count("}") >= 2:  # arguments' "}", then the call's
            first_end = i + 1
    assert first_end is not None
    cut = client.chat.completions.create(
        model="gemma", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=first_end + 4,
    )
    assert cut.choices[0].finish_reason == "tool_calls"
    assert [c.function.arguments for c in cut.choices[0].message.tool_calls or []] == [calls[0].function.arguments]
    assert cut.choices[0].message.content is None
    none = client.chat.completions.create(
        model="gemma", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=first_end - 3,
    )
    assert none.choices[0].finish_reason == "length"
    assert none.choices[0].message.tool_calls is None
    assert not none.choices[0].message.content


NUMBER = re.compile(r"-?(\d+)(?:\.(\d+))?")


def numbers_outside_strings(text: str) -> list[re.Match[str]]:
    """The JSON numbers in `text`, which may be cut short: strings are skipped."""
    found, i, in_string, escaped = [], 0, False, False
    while i < len(text):
        ch = text[i]
        if in_string:
            escaped = not escaped and ch == "\\"
            in_string = escaped or ch != '"'
        elif ch == '"':
            in_string = True
        elif (m := NUMBER.match(text, i)) is not None:
            found.append(m)
            i = m.end()
            continue
        i += 1
    return found


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "properties": {"price": {"type": "number"}}, "required": ["price"]}}},
        {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "number"}}},
        {"type": "json_object"},
    ],
    ids=["number-property", "bare-number", "json-object"],
)
def test_json_numbers_cannot_run_away_in_digits(client: openai.OpenAI, response_format: dict[str, Any]) -> None:
    """Asked for a price, the demo model wrote "1000000..." and "1.1000000..." until
    max_tokens. llama.cpp's JSON grammar bounds a number's parts to 16 digits
    (common/json-schema-to-grammar.cpp); Corral: 16 before the point, 10 after."""
    ask = [{"role": "user", "content": "Give me the price of an apple in euros as JSON."}]
    for temperature in (0.0, 1.0, 1.5):
        r = client.chat.completions.create(
            model="gemma", messages=ask, temperature=temperature, seed=3, max_tokens=120,
            response_format=response_format,  # type: ignore[arg-type]
        )
        text = r.choices[0].message.content or ""
        if response_format["type"] == "json_schema":  # the demo model may wander in an open object
            assert r.choices[0].finish_reason == "stop", text[:200]
            json.loads(text)
        numbers = numbers_outside_strings(text)
        assert numbers or response_format["type"] == "json_object", text[:200]
        for m in numbers:
            assert len(m.group(1)) <= 16 and len(m.group(2) or "") <= 10, text
