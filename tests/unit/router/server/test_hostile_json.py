"""Hostile JSON bodies are 400s that name the parameter (issue 8, finding 2).

JSON nested 100,000 deep inside a free-form field, and bytes that are not UTF-8 inside a
string, both raised past `decode` (RecursionError, UnicodeDecodeError) and became 500s with a
traceback in the log. Every field typed `Any` or `dict[str, Any]`, and every string field,
is tried here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest

from router.server import json_path
from router.api.llama.schemas import TokenizeRequest
from router.server.json_body import decode, decode_any
from router.api.openai import schemas as s
from router.app import create_app
from supervisor.config import parse
from supervisor.errors import InvalidRequest
from supervisor.supervisor import Supervisor
from tests.harness import write_gguf

N = 100_000
DEEP_ARRAY = b"[" * N + b"]" * N
DEEP_OBJECT = b'{"a":' * N + b"1" + b"}" * N
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
MESSAGE = b'{"model": "m", "messages": [{"role": "user", '


def _decode_error(body: bytes, kind: type[msgspec.Struct]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        decode(body, kind)
    return info.value


@pytest.mark.parametrize(
    "kind, body, param",
    [
        (s.ChatRequest, MESSAGE + b'"content": "hi", "x": ' + DEEP_ARRAY + b"}]}", "messages[0].x"),
        (s.ChatRequest, MESSAGE + b'"content": "hi", "x": ' + DEEP_OBJECT + b"}]}", "messages[0].x"),
        (s.ChatRequest, MESSAGE + b'"content": ' + DEEP_ARRAY + b"}]}", "messages[0].content"),
        (s.ChatRequest, CHAT + b'"tool_choice": ' + DEEP_ARRAY + b"}", "tool_choice"),
        (s.ChatRequest, CHAT + b'"tool_choice": ' + DEEP_OBJECT + b"}", "tool_choice"),
        (
            s.ChatRequest,
            CHAT + b'"tools": [{"type": "function", "function": {"name": "f", "parameters": '
            + DEEP_OBJECT + b"}}]}",
            "tools[0].function.parameters",
        ),
        (
            s.ChatRequest,
            CHAT + b'"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": '
            + DEEP_OBJECT + b"}}}",
            "response_format.json_schema.schema",
        ),
        (s.ChatRequest, CHAT + b'"json_schema": ' + DEEP_OBJECT + b"}", "json_schema"),
        (s.CompletionRequest, b'{"model": "m", "json_schema": ' + DEEP_OBJECT + b"}", "json_schema"),
        (s.CompletionRequest, b'{"model": "m", "prompt": ' + DEEP_ARRAY + b"}", "prompt"),
        (s.CompletionRequest, b'{"model": "m", "prompt": ["a", ' + DEEP_ARRAY + b"]}", "prompt[1]"),
        (s.EmbeddingRequest, b'{"model": "m", "input": ' + DEEP_ARRAY + b"}", "input"),
        (s.EmbeddingRequest, b'{"model": "m", "input": [' + DEEP_OBJECT + b"]}", "input[0]"),
    ],
)
def test_deep_nesting_in_a_free_form_field_is_a_400_naming_it(
    kind: type[msgspec.Struct], body: bytes, param: str
) -> None:
    err = _decode_error(body, kind)
    assert err.param == param
    assert param in err.message and "nested too deeply" in err.message


@pytest.mark.parametrize(
    "kind, body",
    [
        # Typed fields reject the first wrong level: a type error with its own path.
        (s.ChatRequest, CHAT + b'"logit_bias": {"1": ' + DEEP_ARRAY + b"}}"),
        (s.ChatRequest, CHAT + b'"metadata": {"k": ' + DEEP_ARRAY + b"}}"),
        (s.ChatRequest, CHAT + b'"stop": ' + DEEP_ARRAY + b"}"),
        (s.ChatRequest, CHAT + b'"stream_options": {"include_usage": ' + DEEP_ARRAY + b"}}"),
        (s.ChatRequest, CHAT + b'"zzz": ' + DEEP_ARRAY + b"}"),
        (s.ChatRequest, DEEP_ARRAY),
        (TokenizeRequest, b'{"model": "m", "content": ' + DEEP_ARRAY + b"}"),
    ],
)
def test_deep_nesting_anywhere_else_is_a_400(kind: type[msgspec.Struct], body: bytes) -> None:
    err = _decode_error(body, kind)
    assert err.message


@pytest.mark.parametrize(
    "kind, body, param",
    [
        (s.ChatRequest, b'{"model": "m\xff", "messages": []}', "model"),
        (s.ChatRequest, MESSAGE + b'"content": "a\xff\xfe"}]}', "messages[0].content"),
        (s.ChatRequest, b'{"model": "m", "messages": [{"role": "us\xc3er", "content": "hi"}]}', "messages[0].role"),
        (
            s.ChatRequest,
            MESSAGE + b'"content": [{"type": "text", "text": "ok"}, {"type": "text", "text": "\xed\xa0\x80"}]}]}',
            "messages[0].content[1].text",
        ),
        (s.ChatRequest, MESSAGE + b'"content": "hi", "na\xffme": "x"}]}', "messages[0].na\ufffdme"),
        (s.ChatRequest, CHAT + b'"stop": ["a", "b\xff"]}', "stop[1]"),
        (s.ChatRequest, CHAT + b'"user": "\xf0\x9f\x98"}', "user"),
        (s.ChatRequest, CHAT + b'"tool_choice": {"function": {"name": "\xff"}}}', "tool_choice.function.name"),
        (s.CompletionRequest, b'{"model": "m", "prompt": "caf\xe9"}', "prompt"),
        (s.EmbeddingRequest, b'{"model": "m", "input": ["ok", "\x80"]}', "input[1]"),
        (TokenizeRequest, b'{"model": "m", "content": "\xc0\xaf"}', "content"),
    ],
)
def test_invalid_utf8_in_a_string_is_a_400_naming_it(
    kind: type[msgspec.Struct], body: bytes, param: str
) -> None:
    err = _decode_error(body, kind)
    assert err.param == param
    assert "not valid UTF-8" in err.message


@pytest.mark.parametrize(
    "body, param, says",
    [
        (b'[{"id": 0, "scale": ' + DEEP_ARRAY + b"}]", "[0].scale", "nested too deeply"),
        (b'{"filename": "a", "x": ' + DEEP_OBJECT + b"}", "x", "nested too deeply"),
        (DEEP_ARRAY, None, "nested too deeply"),
        (b'{"filename": "caf\xe9"}', "filename", "not valid UTF-8"),
        (b'{"filename": ', None, "could not parse"),
    ],
)
def test_a_body_decoded_as_any_json_value_is_a_400_too(
    body: bytes, param: str | None, says: str
) -> None:
    """Issue 40, finding 2: an untyped decode recurses as a typed one does. The readers that
    decoded untyped (llama-server's slot actions and LoRA list, the upstream hook) let the
    RecursionError out as a 500 until they went through json_body."""
    with pytest.raises(InvalidRequest) as info:
        decode_any(body)
    assert info.value.param == param and says in info.value.message


def test_the_walk_is_bounded() -> None:
    """A hostile body cannot make the error path expensive: past MAX_TOKENS the walk
    gives up, and the 400 names no parameter."""
    filler = b"[" + b"1," * json_path.MAX_TOKENS + b"1]"
    body = b'{"model": "m", "prompt": ["a"], "x": ' + filler + b', "y": ' + DEEP_ARRAY + b"}"
    assert json_path.too_deep(body) is None
    err = _decode_error(b'{"model": "m", "prompt": ' + filler[:-1] + b', "\xff"]}', s.CompletionRequest)
    assert err.param is None and "not valid UTF-8" in err.message


def test_json_path_names_keys_and_indices() -> None:
    assert json_path.invalid_utf8(b'{"a": [1, {"b": "x"}, {"c": "\xff"}]}') == "a[2].c"
    assert json_path.invalid_utf8(b'{"a": "ok"}') is None
    # Escaped quotes and brackets inside strings are not structure.
    assert json_path.invalid_utf8(b'{"a": "[\\"{", "b": ["x", "\xff"]}') == "b[1]"
    assert json_path.too_deep(b'{"a": "[[[[", "b": ' + b"[" * 300 + b"]" * 300 + b"}") == "b"
    assert json_path.too_deep(b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}") is None


async def test_hostile_bodies_over_http_are_400s_with_no_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_gguf(tmp_path / "m.gguf")
    cfg = parse('[models.m]\npath = "m.gguf"\n', tmp_path)
    client = create_app(Supervisor(cfg), cfg).test_client()
    cases = [
        ("/v1/chat/completions", MESSAGE + b'"content": "hi", "x": ' + DEEP_ARRAY + b"}]}", "messages[0].x"),
        ("/v1/chat/completions", CHAT + b'"tool_choice": ' + DEEP_ARRAY + b"}", "tool_choice"),
        ("/v1/chat/completions", MESSAGE + b'"content": "a\xff\xfe"}]}', "messages[0].content"),
        ("/v1/completions", b'{"model": "m", "prompt": "a\xff"}', "prompt"),
        ("/v1/embeddings", b'{"model": "m", "input": ' + DEEP_ARRAY + b"}", "input"),
        ("/tokenize", b'{"model": "m", "content": "\xff"}', "content"),
    ]
    with caplog.at_level(logging.INFO):
        for path, body, param in cases:
            r = await client.post(path, data=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, (path, param)
            err = (await r.get_json())["error"]
            assert err["param"] == param and err["type"] == "invalid_request_error"
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
