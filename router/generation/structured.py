"""Structured output, the request side: which grammar a request's output must match.

A dialect names each JSON schema its request asks for with the parameter that asked
(OpenAI's `response_format`, whose `json_object` is any JSON object, ANY_OBJECT;
llama-server's `json_schema`; Ollama's `format`), and passes a GBNF grammar as llama-server's
`grammar` (an empty string asks for nothing, as in llama-server).

At most one of them may constrain a request: two would be two grammars for one output, and
llama-server too refuses json_schema with grammar. The worker compiles what this returns and
answers 400 naming the same parameter when it does not compile (worker/constraint.py), so
nothing here parses a grammar; a schema is only walked, to narrow it.

Pure: no I/O, tested without a model.
"""

from __future__ import annotations

from typing import Any, Sequence

import msgspec

from router.generation.schema_rewrite import SchemaTooDeep, narrowed
from supervisor.errors import InvalidRequest
from worker.protocol import Constraint

# What json_object means, as a schema: llguidance then allows exactly one JSON object.
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# The longest GBNF grammar taken. The worker converts GBNF in Python at about 4 µs a byte,
# holding the GIL that its decoding thread needs, so a 10 MB grammar would slow every
# stream on the model for most of a minute; real grammars run to a few kilobytes.
MAX_GRAMMAR_CHARS = 128 * 1024


def constraint(
    json_schemas: Sequence[tuple[dict[str, Any], str]] = (), grammar: str | None = None
) -> Constraint | None:
    """The constraint a request asks for, or None: `json_schemas` are the schemas asked
    for, each with the parameter that asked. InvalidRequest (400) naming the parameter
    when more than one parameter asks for one."""
    asked = [_schema(schema, param) for schema, param in json_schemas]
    if grammar:
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise InvalidRequest(
                f"Invalid 'grammar': at most {MAX_GRAMMAR_CHARS} characters, got {len(grammar)}.", "grammar"
            )
        asked.append(Constraint(kind="gbnf", source=grammar, param="grammar"))
    if len(asked) > 1:
        first, second = asked[0].param, asked[1].param
        raise InvalidRequest(
            f"'{first}' and '{second}' each constrain the output; send only one of them.", second
        )
    return asked[0] if asked else None


def _schema(schema: dict[str, Any], param: str) -> Constraint:
    """A JSON schema constraint, narrowed as llama-server narrows it: objects closed to
    undeclared keys, integers bounded (router/generation/schema_rewrite.py)."""
    try:
        narrow = narrowed(schema)
    except SchemaTooDeep as exc:
        raise InvalidRequest(f"Invalid '{param}': {exc}.", param) from None
    # ANY_OBJECT itself (not an equal schema a client wrote) is JSON mode, which gave none.
    given = None if schema is ANY_OBJECT else msgspec.json.encode(schema).decode()
    return Constraint(kind="json_schema", source=msgspec.json.encode(narrow).decode(), param=param, given=given)


def json_mode(c: Constraint) -> bool:
    """Whether `c` is JSON mode (OpenAI's json_object, Ollama's "json", Responses'
    json_object): any JSON object, with no schema from the client."""
    return c.kind == "json_schema" and c.given is None
