"""Structured output with the real worker: response_format, json_schema and grammar are
enforced while sampling (worker/constraint.py), through the official openai client with
strict response validation.

Sampling runs at temperature 1.0 where the test claims the output is forced: at that
temperature the 270M demo model writes nothing like the expected text on its own, so only
the constraint explains it.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Server, pooled_briefly

MODEL = "chat-a"
# Every value fixed by `const`, through a nested array: the schema allows exactly one JSON
# text (the worker writes JSON with ", " and ": " between items, and no other whitespace).
FORCED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {"const": "point"},
        "coords": {
            "type": "array",
            "items": {"type": "array", "items": {"const": 7}, "minItems": 2, "maxItems": 2},
            "minItems": 2,
            "maxItems": 2,
        },
    },
    "required": ["kind", "coords"],
    "additionalProperties": False,
}
FORCED_TEXT = '{"kind": "point", "coords": [[7, 7], [7, 7]]}'
ASK = [{"role": "user", "content": "Write a short poem about the sea."}]


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base, api_key="x", max_retries=0, http_client=pooled_briefly(), _strict_response_validation=True)


def forced_format() -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "point", "schema": FORCED_SCHEMA, "strict": True}}


def test_json_schema_forces_the_only_allowed_output_10_of_10(client: openai.OpenAI) -> None:
    for _ in range(10):
        r = client.chat.completions.create(
            model=MODEL, messages=ASK, response_format=forced_format(),  # type: ignore[arg-type]
            temperature=1.0, max_tokens=64,
        )
        choice = r.choices[0]
        assert choice.message.content == FORCED_TEXT
        # The grammar completing ends the answer: a stop, not the token limit.
        assert choice.finish_reason == "stop"


def test_streamed_constrained_answer_concatenates_to_valid_json(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, response_format=forced_format(),  # type: ignore[arg-type]
        temperature=1.0, max_tokens=64, stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # really streamed
    assert json.loads(text) == {"kind": "point", "coords": [[7, 7], [7, 7]]}
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_json_object_returns_parseable_json(client: openai.OpenAI) -> None:
    # A short object to copy: its tokens win by wide margins, so the grammar's end (a stop)
    # comes well within max_tokens. "Describe a cat as a JSON object" let the demo model
    # run on inside a string to the limit in a fresh-clone run, on a near tie.
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": 'Write this JSON object exactly: {"name": "Tom", "age": 3}'}],
        response_format={"type": "json_object"},
        temperature=0.0,
        max_tokens=400,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content or ""), dict)


def test_json_schema_extension_on_chat(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=1.0, max_tokens=64, extra_body={"json_schema": FORCED_SCHEMA}
    )
    assert r.choices[0].message.content == FORCED_TEXT


def test_max_tokens_still_cuts_a_constrained_answer(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, response_format=forced_format(),  # type: ignore[arg-type]
        temperature=1.0, max_tokens=3,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert FORCED_TEXT.startswith(choice.message.content or "")
    assert r.usage is not None and r.usage.completion_tokens == 3


def test_grammar_on_completions(client: openai.OpenAI) -> None:
    seen = set()
    for _ in range(4):
        r = client.completions.create(
            model=MODEL, prompt="Is the sky green? Answer:", max_tokens=8, temperature=1.0,
            extra_body={"grammar": 'root ::= " " ("yes" | "no") "."'},
        )
        seen.add(r.choices[0].text)
        assert r.choices[0].finish_reason == "stop"
    assert seen <= {" yes.", " no."}


def test_stop_strings_still_apply(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, response_format=forced_format(),  # type: ignore[arg-type]
        temperature=1.0, max_tokens=64, stop=["coords"],
    )
    assert r.choices[0].message.content == '{"kind": "point", "'
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "kw, param",
    [
        # A $ref to nowhere: valid JSON, but no grammar can be made of it.
        (
            {"response_format": {"type": "json_schema", "json_schema": {
                "name": "broken", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}}}}},
            "response_format",
        ),
        ({"extra_body": {"json_schema": {"type": "no-such-type"}}}, "json_schema"),
        ({"extra_body": {"grammar": "root ::= undefined-rule"}}, "grammar"),
        ({"extra_body": {"grammar": 'root ::= "a" ((('}}, "grammar"),
    ],
)
def test_uncompilable_constraint_is_a_400_naming_it_and_the_worker_lives(
    client: openai.OpenAI, server: Server, kw: dict[str, Any], param: str
) -> None:
    client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)  # the worker is up
    pid = server.workers()[MODEL]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, **kw)
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param, body
    assert server.workers()[MODEL] == pid
    # And it still serves.
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0.0)
    assert r.choices[0].message.content is not None


def test_two_constraints_are_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=4, response_format={"type": "json_object"},
            extra_body={"grammar": 'root ::= "a"'},
        )
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "grammar"
