"""router/server/openapi.py: the served document is generated from the dialects' request
types (router/app.py gathers them)."""

from __future__ import annotations

import msgspec
import pytest

from router.api import llama
from router.api.anthropic import errors as anthropic_errors
from router.api.anthropic.schemas import AnthropicErrorBody
from router.api.llama.errors import native_envelope
from router.api.llama.schemas import NativeErrorBody
from router.api.openai import schemas
from router.api.openai.errors import envelope
from router.app import openapi_document


def _schema(doc: dict[str, object], name: str) -> dict[str, object]:
    return doc["components"]["schemas"][name]  # type: ignore[index, no-any-return]


@pytest.mark.parametrize("kind", [schemas.ChatRequest, schemas.CompletionRequest, schemas.EmbeddingRequest])
def test_every_request_field_is_documented_with_its_bounds(kind: type[msgspec.Struct]) -> None:
    doc = openapi_document()
    props = _schema(doc, kind.__name__)["properties"]
    assert set(props) == set(kind.__struct_fields__)  # type: ignore[arg-type]
    if "max_tokens" in props:  # type: ignore[operator]
        bounds = props["max_tokens"]["anyOf"][0]  # type: ignore[index]
        assert bounds["maximum"] == 2**31 - 1 and bounds["minimum"] == -(2**31)


def test_ignored_fields_are_in_the_chat_schema_and_the_description() -> None:
    doc = openapi_document()
    props = _schema(doc, "ChatRequest")["properties"]
    for name in schemas.IGNORED:
        assert name in props  # type: ignore[operator]
        assert name in doc["info"]["description"]  # type: ignore[index]


def test_every_operation_answers_errors_in_the_generated_error_schema() -> None:
    doc = openapi_document()
    assert _schema(doc, "ErrorDetail")["required"] == ["message", "type", "param", "code"]
    native = {op.path for op in llama.OPERATIONS}
    assert {"/completion", "/tokenize", "/detokenize", "/apply-template"} <= native
    for path, methods in doc["paths"].items():  # type: ignore[attr-defined]
        for op in methods.values():
            ref = op["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"]
            want = (
                "NativeErrorBody" if path in native
                else "OllamaErrorBody" if path.startswith("/api/")
                else "AnthropicErrorBody" if path.startswith("/v1/messages")
                else "ErrorBody"  # OpenAI's, the Responses API's too
            )
            assert ref == f"#/components/schemas/{want}", path


def test_the_error_schema_matches_what_the_router_sends() -> None:
    body = msgspec.json.encode(envelope("m", "invalid_request_error", None, None))
    msgspec.json.decode(body, type=schemas.ErrorBody)  # raises if the shapes drift apart
    anthropic_body, _, _ = anthropic_errors.render_http(400, "m", None)
    assert msgspec.json.decode(anthropic_body, type=AnthropicErrorBody).error.type == "invalid_request_error"
    native = msgspec.json.encode(native_envelope(400, "m", "prompt"))
    assert msgspec.json.decode(native, type=NativeErrorBody).error.code == 400
