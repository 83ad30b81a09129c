"""router/generation/schema_rewrite.py: objects closed to undeclared keys and integers bounded, as
llama-server narrows them; local references moved with an embedded schema; client data
left as it was sent.

Narrowing must only ever remove answers: every instance the narrowed schema accepts, the
client's own accepts too (checked with jsonschema), so the constrained answer stays valid
under the schema the client sent."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import llguidance
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.generation.schema_rewrite import (
    _ANY_VALUE_SCHEMA, ANY_VALUE, MAX_DEPTH, NUMBER_STEP, SAFE_INTEGER, SchemaTooDeep, narrowed, relocated,
)

CITY = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def test_an_object_with_properties_is_closed_and_the_input_is_not_touched() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    before = copy.deepcopy(schema)
    out = narrowed(schema)
    assert out == {**before, "additionalProperties": False}
    assert schema == before


def test_objects_are_closed_at_every_schema_position() -> None:
    schema = {
        "type": "object",
        "properties": {
            "list": {"type": "array", "items": CITY},
            "tuple": {"type": "array", "prefixItems": [CITY]},
            "either": {"anyOf": [CITY, {"type": "null"}]},
            "ref": {"$ref": "#/$defs/City"},
            "map": {"type": "object", "additionalProperties": CITY},
        },
        "$defs": {"City": CITY},
        "definitions": {"Old": CITY},
    }
    out = narrowed(schema)
    props = out["properties"]
    closed_city = {**CITY, "additionalProperties": False}  # CITY has no integer to bound
    assert out["additionalProperties"] is False
    assert props["list"]["items"] == closed_city
    assert props["tuple"]["prefixItems"] == [closed_city]
    assert props["either"]["anyOf"] == [closed_city, {"type": "null"}]
    assert props["map"] == {"type": "object", "additionalProperties": closed_city}  # its own choice kept
    assert out["$defs"]["City"] == closed_city and out["definitions"]["Old"] == closed_city


ANY = {"$ref": f"#/$defs/{ANY_VALUE}"}


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        # json_object: any object
        ({"type": "object"}, {"type": "object", "additionalProperties": ANY}),
        (
            {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
            {"type": "object", "properties": {"a": ANY}, "additionalProperties": ANY},
        ),
        (
            {"type": "object", "properties": {"a": {"description": "x"}}, "additionalProperties": {"type": "string"}},
            {"type": "object", "properties": {"a": ANY}, "additionalProperties": {"type": "string"}},
        ),
        (
            {"type": "object", "properties": {"a": True}, "patternProperties": {"^x": {}}},
            {"type": "object", "properties": {"a": ANY}, "patternProperties": {"^x": ANY}},
        ),
        # `required` names a key the object does not list: closing would make it unsatisfiable
        (
            {"type": "object", "properties": {"a": {}}, "required": ["a", "b"]},
            {"type": "object", "properties": {"a": ANY}, "required": ["a", "b"], "additionalProperties": ANY},
        ),
        ({"type": "array"}, {"type": "array", "items": ANY}),
        ({}, ANY),
    ],
)
def test_objects_that_say_otherwise_stay_open_with_bounded_values(schema: dict[str, Any], expected: dict[str, Any]) -> None:
    """Their choice stands; what they leave free is any JSON value with bounded numbers
    (issue 20: json_object answers ran away in digits like typed numbers did)."""
    out = narrowed(schema)
    assert out.pop("$defs") == {ANY_VALUE: _ANY_VALUE_SCHEMA}
    assert out == expected


def test_a_free_value_takes_no_runaway_number_and_any_value_else() -> None:
    schema = narrowed({"type": "object"})
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    tok = llguidance.LLTokenizer("byte")

    def accepts(text: str) -> bool:
        m = llguidance.LLMatcher(tok, grammar, log_level=0)
        return bool(m.consume_tokens(tok.tokenize_str(text))) and not m.is_error() and m.is_accepting()

    assert accepts('{"a":1.5,"b":[1,{"c":null}],"d":"x","e":true,"f":-9007199254740991}')
    assert not accepts('{"a":1' + "0" * 17 + "}")  # 18 digits
    assert not accepts('{"a":1.' + "0" * 11 + "}")  # 11 digits after the point
    assert not accepts('{"a":[{"b":2' + "0" * 20 + "}]}")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
        {"oneOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
        {"not": {"type": "object", "properties": {"a": {}}}},
        {"if": {"properties": {"a": {}}}, "then": {"required": ["a"]}},
        {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False},
        {"type": "object", "properties": {"a": {}}, "dependentSchemas": {"a": {"properties": {"b": {}}}}},
    ],
)
def test_a_keyword_under_which_closing_is_unsafe_leaves_the_whole_schema_open(schema: dict[str, Any]) -> None:
    assert narrowed(schema) == schema
    # anywhere in the schema: CITY beside it stays open too
    whole = {"type": "object", "properties": {"x": schema, "city": CITY}}
    assert narrowed(whole) == whole


@pytest.mark.parametrize(
    ("schema", "bounds"),
    [
        ({"type": "integer"}, {"minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER}),
        ({"type": ["integer", "null"]}, {"minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER}),
        ({"type": "integer", "minimum": 0}, {"minimum": 0, "maximum": SAFE_INTEGER}),
        ({"type": "integer", "exclusiveMaximum": 10}, {"minimum": -SAFE_INTEGER, "exclusiveMaximum": 10}),
        ({"type": "integer", "minimum": -10**20, "maximum": 10**20}, {"minimum": -10**20, "maximum": 10**20}),
        # Issue 20: the demo model wrote "1.1000000..." for a price until max_tokens.
        ({"type": "number"}, {"minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER, "multipleOf": NUMBER_STEP}),
        ({"type": "number", "multipleOf": 0.5, "minimum": 0}, {"maximum": SAFE_INTEGER}),
        ({"type": "string"}, {}),
    ],
)
def test_numbers_without_bounds_get_the_safe_integer_range_and_a_step(schema: dict[str, Any], bounds: dict[str, int]) -> None:
    out = narrowed({"type": "object", "properties": {"n": schema}})["properties"]["n"]
    assert out == {**schema, **bounds}


@pytest.mark.parametrize(
    "schema",
    [
        {"properties": {}, "required": [[1]]},
        {"properties": {}, "required": [{"a": 1}]},
        {"properties": [1]},
        {"items": [5, None]},
        {"$defs": {"a": 5}},
        {"type": [["integer"]]},
        {"type": {"a": 1}},
        {"anyOf": "x", "oneOf": 3},
    ],
)
def test_malformed_schemas_pass_through_for_the_engine_to_refuse(schema: dict[str, Any]) -> None:
    # A TypeError here would be a 500; llguidance names what is wrong with a 400 instead.
    assert narrowed(schema) == schema
    assert relocated(schema, "/x") == schema


def test_data_in_const_enum_default_and_examples_is_left_as_sent() -> None:
    data = {"properties": {"p": 1}, "$ref": "#/x"}
    schema = {"type": "object", "properties": {"a": {"const": data, "enum": [data], "default": data, "examples": [data]}}}
    out = narrowed(schema)
    assert out["properties"]["a"] == schema["properties"]["a"]
    moved = relocated(schema, "/properties/arguments")
    assert moved["properties"]["a"] == schema["properties"]["a"]


INSTANCES = [
    {"name": "x"},
    {"name": "x", "n": 3},
    {"name": "x", "n": 10**17},
    {"name": "x", "extra": 1},
    {"items": [{"name": "x"}]},
    {"items": [{"name": "x", "extra": True}]},
    {"items": [{"name": "x"}], "extra": None},
    {},
    {"items": []},
    {"name": 5},
]


@pytest.mark.parametrize(
    "schema",
    [
        CITY,
        {"type": "object", "properties": {"items": {"type": "array", "items": CITY}}},
        {"type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/C"}}}, "$defs": {"C": CITY}},
        {"anyOf": [CITY, {"type": "object", "properties": {"items": {}}}]},
        {"type": "object", "properties": {"name": {}, "n": {"type": "integer"}}},
    ],
)
def test_narrowing_only_removes_answers(schema: dict[str, Any]) -> None:
    strict, loose = jsonschema.Draft202012Validator(narrowed(schema)), jsonschema.Draft202012Validator(schema)
    accepted = [i for i in INSTANCES if strict.is_valid(i)]
    assert accepted, "the narrowed schema still accepts something"
    assert all(loose.is_valid(i) for i in accepted)
    assert any(loose.is_valid(i) and not strict.is_valid(i) for i in INSTANCES)  # it did narrow something


def test_local_refs_follow_the_schema_to_its_new_place() -> None:
    params = {
        "type": "object",
        "properties": {"city": {"$ref": "#/$defs/City"}, "self": {"$ref": "#"}, "other": {"$ref": "other.json#/x"}},
        "$defs": {"City": {"type": "object", "properties": {"next": {"$ref": "#/$defs/City"}}}},
    }
    out = relocated(params, "/properties/arguments")
    assert out["properties"]["city"] == {"$ref": "#/properties/arguments/$defs/City"}
    assert out["properties"]["self"] == {"$ref": "#/properties/arguments"}
    assert out["properties"]["other"] == {"$ref": "other.json#/x"}  # not a local pointer
    assert out["$defs"]["City"]["properties"]["next"] == {"$ref": "#/properties/arguments/$defs/City"}
    assert params["properties"]["city"] == {"$ref": "#/$defs/City"}  # the client's copy as sent


def test_a_relocated_schema_validates_the_same_instances_where_it_now_sits() -> None:
    params = {"type": "object", "properties": {"city": {"$ref": "#/$defs/City"}}, "$defs": {"City": CITY}}
    doc = {"type": "object", "properties": {"arguments": relocated(params, "/properties/arguments")}}
    v = jsonschema.Draft202012Validator(doc)
    assert v.is_valid({"arguments": {"city": {"name": "Paris"}}})
    assert not v.is_valid({"arguments": {"city": {"name": 5}}})
    # llguidance resolves the moved pointer too (it refused the unmoved one with a 400)
    grammar = llguidance.grammar_from("json_schema", json.dumps(doc))
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    unmoved = llguidance.grammar_from("json_schema", json.dumps({"type": "object", "properties": {"arguments": params}}))
    assert llguidance.LLMatcher.validate_grammar(unmoved) != ""


def test_pointer_tokens_are_escaped() -> None:
    params = {"type": "object", "properties": {"a/b~c": {"type": "object", "properties": {"d": {"$ref": "#/properties/a~1b~0c"}}}}}
    out = relocated(params, "/x")
    assert out["properties"]["a/b~c"]["properties"]["d"] == {"$ref": "#/x/properties/a~1b~0c"}


@pytest.mark.parametrize("rewrite", [narrowed, lambda s: relocated(s, "/a")])
def test_a_schema_past_the_depth_limit_raises_schema_too_deep(rewrite: Any) -> None:
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(MAX_DEPTH + 1):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaTooDeep):
        rewrite(deep)
    shallow: dict[str, Any] = {"type": "integer"}
    for _ in range(MAX_DEPTH - 1):
        shallow = {"type": "array", "items": shallow}
    rewrite(shallow)  # just under the limit: rewritten


KEYWORDS = ["type", "properties", "required", "items", "prefixItems", "anyOf", "oneOf", "allOf", "$ref", "$defs",
            "additionalProperties", "minimum", "maximum", "const", "enum", "not", "integer", "object"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.sampled_from(KEYWORDS + ["#", "#/a"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(KEYWORDS), children, max_size=5),
    max_leaves=30,
)


@given(st.dictionaries(st.sampled_from(KEYWORDS), json_values, max_size=6))
@settings(max_examples=400, deadline=None)
def test_any_json_object_is_rewritten_without_error(schema: dict[str, Any]) -> None:
    # Whatever a client sends as a schema, the rewrites return a dict (a TypeError would be
    # a 500) and leave the client's copy alone.
    before = copy.deepcopy(schema)
    assert isinstance(narrowed(schema), dict)
    assert isinstance(relocated(schema, "/properties/arguments"), dict)
    assert schema == before
