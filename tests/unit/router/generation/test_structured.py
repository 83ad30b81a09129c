"""router/generation/structured.py and the structured-output parameters of router/api/openai/schemas.py: which
constraint a request asks for, and a 400 naming the parameter for every malformed or
conflicting one."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from router.api.openai import translate
from router.server.json_body import decode
from router.api.openai.fields import json_schemas
from router.generation import structured
from router.api.openai import schemas as s
from router.generation.schema_rewrite import ANY_VALUE, narrowed
from supervisor.errors import InvalidRequest
from worker.protocol import Constraint


def constraint(
    response_format: s.ResponseFormat | None = None, json_schema: dict[str, Any] | None = None, grammar: str | None = None
) -> Constraint | None:
    """What a request with these three parameters is constrained by: OpenAI's and
    llama-server's schemas as the OpenAI dialect names them, through the shared rule."""
    return structured.constraint(json_schemas(response_format, json_schema), grammar)


def chat(**fields: Any) -> s.ChatRequest:
    fields.setdefault("model", "m")
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return decode(msgspec.json.encode(fields), s.ChatRequest)


def completion(**fields: Any) -> s.CompletionRequest:
    fields.setdefault("model", "m")
    return decode(msgspec.json.encode(fields), s.CompletionRequest)


SCHEMA = {"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"]}
# What the worker is sent for SCHEMA: its object closed to undeclared keys, as llama-server
# closes it (router/generation/schema_rewrite.py).
SENT = {**SCHEMA, "additionalProperties": False}


# ---- decoding response_format -------------------------------------------------------------------


def test_response_format_text_decodes_and_asks_for_nothing() -> None:
    r = chat(response_format={"type": "text"})
    assert isinstance(r.response_format, s.ResponseFormatText)
    assert constraint(r.response_format) is None


def test_response_format_json_schema_decodes_every_field() -> None:
    r = chat(response_format={"type": "json_schema", "json_schema": {
        "name": "my-schema_1", "schema": SCHEMA, "strict": True, "description": "d"}})
    assert isinstance(r.response_format, s.ResponseFormatJsonSchema)
    js = r.response_format.json_schema
    assert (js.name, js.schema, js.strict, js.description) == ("my-schema_1", SCHEMA, True, "d")


def test_a_json_schema_without_a_name_is_taken_as_llama_server_takes_it() -> None:
    """llama.cpp's test_chat_completion.py test_completion_with_response_format sends
    {"type": "json_schema", "json_schema": {"schema": {"const": "foooooo"}}}: no name."""
    r = chat(response_format={"type": "json_schema", "json_schema": {"schema": {"const": "foooooo"}}})
    assert isinstance(r.response_format, s.ResponseFormatJsonSchema)
    assert r.response_format.json_schema.name is None and r.response_format.json_schema.schema == {"const": "foooooo"}


@pytest.mark.parametrize(
    "fmt, param",
    [
        ({"type": "xml"}, "response_format.type"),
        ({}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "has space"}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": ""}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "x" * 65}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "n", "schema": []}}, "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "n", "strict": "yes"}}, "response_format.json_schema.strict"),
        ({"type": "json_schema", "json_schema": {"name": "n", "extra": 1}}, "response_format.json_schema.extra"),
        ({"type": "json_object", "schema": 123}, "response_format.schema"),
        ("json", "response_format"),
    ],
)
def test_malformed_response_format_names_the_parameter(fmt: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        chat(response_format=fmt)
    assert info.value.param == param


def test_json_object_with_a_schema_is_that_schema_as_llama_server_takes_it() -> None:
    """Issue 22, item 2: llama-server's json_object takes a `schema` (its
    test_chat_completion.py test_completion_with_response_format sends {"const": "42"});
    instructor's JSON_SCHEMA mode sends it too. Was a 400 naming response_format.schema."""
    c = constraint(s.ResponseFormatJsonObject(schema={"const": "42"}))
    assert c is not None and c.param == "response_format" and json.loads(c.source) == {"const": "42"}
    r = chat(response_format={"type": "json_object", "schema": {"type": "array", "items": {"type": "integer"}}})
    job = translate.chat_job(r, "m")
    assert job.params.constraint is not None and json.loads(job.params.constraint.source)["type"] == "array"
    # An empty schema, as an absent one, is any object (llama-server: "an absent or empty
    # schema means any object").
    assert constraint(s.ResponseFormatJsonObject(schema={})) == constraint(s.ResponseFormatJsonObject())


def test_name_of_64_characters_is_accepted() -> None:
    r = chat(response_format={"type": "json_schema", "json_schema": {"name": "a" * 64}})
    assert isinstance(r.response_format, s.ResponseFormatJsonSchema)


@pytest.mark.parametrize("make", [chat, completion])
def test_llama_server_extensions_are_typed(make: Any) -> None:
    with pytest.raises(InvalidRequest) as info:
        make(json_schema="{}")
    assert info.value.param == "json_schema"
    with pytest.raises(InvalidRequest) as info:
        make(grammar={"root": "x"})
    assert info.value.param == "grammar"


def test_completions_have_no_response_format() -> None:
    # OpenAI's legacy completions take none; llama-server's json_schema/grammar do the job.
    with pytest.raises(InvalidRequest) as info:
        completion(response_format={"type": "json_object"})
    assert info.value.param == "response_format"


# ---- which constraint ---------------------------------------------------------------------------


def test_json_object_is_the_any_object_schema_with_bounded_values() -> None:
    c = constraint(s.ResponseFormatJsonObject())
    assert c is not None and c.param == "response_format" and c.kind == "json_schema"
    assert json.loads(c.source) == narrowed({"type": "object"})
    assert json.loads(c.source)["additionalProperties"] == {"$ref": f"#/$defs/{ANY_VALUE}"}


def test_json_schema_format_carries_its_schema_closed() -> None:
    fmt = s.ResponseFormatJsonSchema(s.JsonSchemaFormat(name="n", schema=SCHEMA))
    c = constraint(fmt)
    assert c is not None and c.kind == "json_schema" and c.param == "response_format"
    assert json.loads(c.source) == SENT
    assert "additionalProperties" not in SCHEMA  # the client's schema is left as it sent it


def test_json_schema_format_without_a_schema_is_any_object() -> None:
    c = constraint(s.ResponseFormatJsonSchema(s.JsonSchemaFormat(name="n")))
    assert c is not None and json.loads(c.source) == narrowed({"type": "object"})


def test_json_schema_extension() -> None:
    c = constraint(json_schema=SCHEMA)
    assert c is not None and c.param == "json_schema" and json.loads(c.source) == SENT


def test_grammar_extension_is_gbnf() -> None:
    assert constraint(grammar='root ::= "yes"') == Constraint("gbnf", 'root ::= "yes"', "grammar")


def test_nothing_asked() -> None:
    assert constraint() is None
    assert constraint(grammar="") is None  # llama-server: an empty grammar is none


@pytest.mark.parametrize(
    "kw, param",
    [
        ({"response_format": s.ResponseFormatJsonObject(), "grammar": "root ::= x"}, "grammar"),
        ({"json_schema": SCHEMA, "grammar": "root ::= x"}, "grammar"),
        ({"response_format": s.ResponseFormatJsonObject(), "json_schema": SCHEMA}, "json_schema"),
        (
            {"response_format": s.ResponseFormatJsonSchema(s.JsonSchemaFormat(name="n", schema=SCHEMA)),
             "grammar": "root ::= x"},
            "grammar",
        ),
    ],
)
def test_two_constraints_are_a_400_naming_the_second(kw: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        constraint(**kw)
    assert info.value.param == param
    assert "only one" in info.value.message


def test_text_format_with_a_grammar_is_the_grammar() -> None:
    c = constraint(s.ResponseFormatText(), grammar='root ::= "a"')
    assert c is not None and c.param == "grammar"


# ---- into the job -------------------------------------------------------------------------------


def test_chat_job_carries_the_constraint() -> None:
    job = translate.chat_job(chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}), "m")
    c = job.params.constraint
    assert c is not None and c.param == "response_format" and json.loads(c.source) == SENT


def test_chat_job_without_structured_output_has_none() -> None:
    assert translate.chat_job(chat(), "m").params.constraint is None


def test_chat_job_conflict_is_a_400() -> None:
    with pytest.raises(InvalidRequest) as info:
        translate.chat_job(chat(json_schema=SCHEMA, grammar='root ::= "a"'), "m")
    assert info.value.param == "grammar"


def test_completion_job_carries_grammar_and_json_schema() -> None:
    c = translate.completion_job(completion(prompt="p", grammar='root ::= "a"'), "m").params.constraint
    assert c == Constraint("gbnf", 'root ::= "a"', "grammar")
    c = translate.completion_job(completion(prompt="p", json_schema=SCHEMA), "m").params.constraint
    assert c is not None and c.param == "json_schema"


def test_constraint_survives_the_wire() -> None:
    # The frame the supervisor sends the worker: msgpack round trip keeps the constraint.
    params = translate.chat_job(chat(response_format={"type": "json_object"}), "m").params
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=type(params))
    assert back.constraint == params.constraint


def test_a_grammar_past_the_cap_is_a_400_naming_it() -> None:
    ok = 'root ::= "a"' + " " * (structured.MAX_GRAMMAR_CHARS - 12)
    assert constraint(grammar=ok) is not None
    with pytest.raises(InvalidRequest) as info:
        constraint(grammar=ok + " ")
    assert info.value.param == "grammar"


def test_a_schema_nested_past_the_walk_limit_is_a_400_naming_it() -> None:
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}}
    for kw, param in (({"json_schema": deep}), "json_schema"), (
        {"response_format": s.ResponseFormatJsonSchema(s.JsonSchemaFormat(name="n", schema=deep))},
        "response_format",
    ):
        with pytest.raises(InvalidRequest) as info:
            constraint(**kw)
        assert info.value.param == param and "nested" in str(info.value)
