"""Rewrites of a client's JSON schema before the worker compiles it into a grammar.

- `narrowed`: what a small model given the room fills with junk is closed, as llama.cpp's
  own converter (llama-server's `json_schema` and `response_format`) closes it, so an
  answer from Corral has the shape an answer from llama-server would have:
  - an object that lists its `properties` and says nothing of `additionalProperties`
    takes no other keys. JSON Schema allows any other key there, and the demo model
    answered a one-parameter tool with five invented keys. (vLLM's guidance backend closes
    them too.) A schema that says `"additionalProperties": true` keeps its extras.
  - an integer with no bound gets JSON's safe-integer range, ±(2^53 - 1), 16 digits at
    most. The demo model, asked for a number of nights, wrote zeros until max_tokens;
    llama.cpp's grammar allows 16 digits, and outlines bounds digits for the same reason.
  - a number with no bound gets the same range and at most 10 digits after the point
    (`multipleOf` 1e-10: llguidance then writes no exponent, and refuses a finer step).
    Asked for a price, the demo model wrote "1000000..." and "1.1000000..." until
    max_tokens (issue 20); llama.cpp's grammar bounds a number's parts to 16 digits each.
  - a value the schema leaves free (`{}`, `true`, an object with no `properties`, an array
    with no `items`: what `response_format: json_object` and a tool without parameters
    allow) is any JSON value whose numbers are so bounded, defined once in `$defs`.
  Narrowing only ever removes answers: whatever the narrowed schema accepts, the client's
  own accepts too.
- `relocated`: a schema embedded inside a larger one (a tool's parameters inside the
  grammar of a forced call) has its local `$ref`s point to where it now sits. Without it,
  `{"$ref": "#/$defs/City"}` (what pydantic writes for a nested model) names the root of
  the call's schema, which holds no `$defs`, and the request failed with a 400.

Both rewrites return new dicts and leave the client's untouched. They walk schema
positions only, so a `const`, `enum`, `default` or `examples` value that happens to hold a
"properties" or "$ref" key is data, and stays as sent. Pure.
"""

from __future__ import annotations

from typing import Any, Callable

# Keywords whose value is a schema, a list of schemas, or a name -> schema mapping.
_ONE = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames",
        "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_LIST = ("items", "prefixItems", "anyOf", "oneOf", "allOf")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")

# Where narrowing a subschema could make the answer invalid, or the schema unsatisfiable:
# under `not` or `if` a stricter branch means a looser whole; in `oneOf` a narrowed branch
# can accept what two open branches both accepted (oneOf forbids that); `allOf` branches
# that each close over their own keys refuse each other's; and the `unevaluated*` and
# `dependentSchemas` keywords read keys other branches declare. A schema that uses any of
# them anywhere is left as sent.
_NARROWING_UNSAFE = frozenset({"not", "if", "oneOf", "allOf", "unevaluatedProperties", "dependentSchemas"})


# Schema levels a rewrite walks. Real schemas nest a few levels; the worker's JSON reader
# refuses past 128 levels of JSON anyway (two per schema level, through "properties"), and
# stopping here keeps a hostile schema from exhausting the router's stack.
MAX_DEPTH = 128


class SchemaTooDeep(ValueError):
    """A schema nested past MAX_DEPTH: the caller's 400 names its parameter."""


def _map_children(schema: dict[str, Any], at: str, depth: int, f: Callable[[Any, str, int], Any]) -> dict[str, Any]:
    """`schema` with `f(child, pointer, depth)` applied to each subschema; `at` is the
    JSON pointer of `schema` in its document, `depth` its level."""
    if depth >= MAX_DEPTH:
        raise SchemaTooDeep(f"the schema is nested more than {MAX_DEPTH} levels deep")
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = f(out[key], f"{at}/{_escape(key)}", depth + 1)
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [f(s, f"{at}/{_escape(key)}/{i}", depth + 1) for i, s in enumerate(out[key])]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: f(s, f"{at}/{_escape(key)}/{_escape(name)}", depth + 1) for name, s in out[key].items()}
    return out


def _escape(token: str) -> str:
    """A JSON pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def _uses(schema: Any, keywords: frozenset[str], depth: int = 0) -> bool:
    """Whether `schema` or any subschema has one of `keywords`."""
    if not isinstance(schema, dict):
        return False
    if not keywords.isdisjoint(schema):
        return True
    found: list[bool] = []
    _map_children(schema, "", depth, lambda s, _, d: found.append(_uses(s, keywords, d)))
    return any(found)


# JSON's safe-integer range (RFC 8259, section 6): the bound of an integer that sets none.
SAFE_INTEGER = 2**53 - 1
# The finest step of a number that sets none: 10 digits after the point.
NUMBER_STEP = 1e-10

# Any JSON value, with its numbers bounded: what a free position of a schema becomes.
ANY_VALUE = "corral_any_value"
_ANY_REF = {"$ref": f"#/$defs/{ANY_VALUE}"}
_BOUNDED_NUMBER = {"type": "number", "minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER, "multipleOf": NUMBER_STEP}
_ANY_VALUE_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        _BOUNDED_NUMBER,
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": _ANY_REF},
        {"type": "object", "additionalProperties": _ANY_REF},
    ]
}
# Keywords that say something of a value without constraining it.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"})


def _is_type(s: dict[str, Any], name: str) -> bool:
    t = s.get("type")
    return t == name or (isinstance(t, list) and name in t)


def _is_integer(s: dict[str, Any]) -> bool:
    return _is_type(s, "integer")


def _free(s: Any) -> bool:
    """Whether a subschema allows any value at all."""
    return s is True or (isinstance(s, dict) and set(s) <= _ANNOTATIONS)


def narrowed(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with
    - every object that lists `properties`, and says nothing of `additionalProperties` or
      `patternProperties`, closed to other keys; an object whose `required` names a key
      it does not list stays open (closing it would make it unsatisfiable);
    - every integer without a lower (upper) bound given -SAFE_INTEGER (SAFE_INTEGER);
    - every number so too, and NUMBER_STEP as its step unless it has one;
    - every free position (a subschema that allows anything, an object's other keys where
      it has no `properties`, an array's items where it sets none) the bounded ANY_VALUE.
    A schema that uses a keyword in _NARROWING_UNSAFE anywhere is returned as it is.
    SchemaTooDeep past MAX_DEPTH levels."""
    if _uses(schema, _NARROWING_UNSAFE) or (isinstance(schema.get("$defs"), dict) and ANY_VALUE in schema["$defs"]):
        return schema
    used = False

    def free(s: Any) -> Any:
        nonlocal used
        if not _free(s):
            return s
        used = True
        return dict(_ANY_REF)

    def narrow(s: Any, at: str, depth: int) -> Any:
        if not isinstance(s, dict) or _free(s):
            return free(s)  # a boolean schema, or one that allows anything
        out = _map_children(s, at, depth, narrow)
        for key in ("additionalProperties", "items"):
            if out.get(key) is True:
                out[key] = free(True)
        props = out.get("properties")
        required = out.get("required")
        if "additionalProperties" not in out and "patternProperties" not in out:
            if isinstance(props, dict) and (
                # (a malformed `required` is the engine's to refuse: leave it open)
                not isinstance(required, list) or all(isinstance(r, str) and r in props for r in required)
            ):
                out["additionalProperties"] = False
            elif (isinstance(props, dict) or _is_type(out, "object")) and (
                required is None or (isinstance(required, list) and all(isinstance(r, str) for r in required))
            ):
                # Open, as sent (no properties, or a `required` key it does not list): its
                # other keys' values are any value, with bounded numbers.
                out["additionalProperties"] = free(True)
        if _is_type(out, "array") and "items" not in out and "prefixItems" not in out:
            out["items"] = free(True)
        number = _is_type(out, "number")
        if _is_integer(out) or number:
            if "minimum" not in out and "exclusiveMinimum" not in out:
                out["minimum"] = -SAFE_INTEGER
            if "maximum" not in out and "exclusiveMaximum" not in out:
                out["maximum"] = SAFE_INTEGER
        if number and "multipleOf" not in out:
            out["multipleOf"] = NUMBER_STEP
        return out

    result: dict[str, Any] = narrow(schema, "", 0)
    if used:
        defs = result.get("$defs")
        result["$defs"] = {**(defs if isinstance(defs, dict) else {}), ANY_VALUE: _ANY_VALUE_SCHEMA}
    return result


def relocated(schema: dict[str, Any], at: str) -> dict[str, Any]:
    """`schema`, to be placed at JSON pointer `at` of a larger document, with its local
    references (`#` and `#/...`) rewritten to point into it there. Other references (an
    `$id`'s, an anchor's, a remote one) are left as they are. SchemaTooDeep past
    MAX_DEPTH levels."""

    def move(s: Any, here: str, depth: int) -> Any:
        if not isinstance(s, dict):
            return s
        out = _map_children(s, here, depth, move)
        ref = out.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            out["$ref"] = "#" + at + ref[1:]
        return out

    result: dict[str, Any] = move(schema, at, 0)
    return result
