"""`corral chat --url` reads a server's answer nested 50,000 deep as an answer that is not
JSON: a ChatError in words, never a traceback (corral/chat/over_http.py promises so for
anything that is not a chunk). It may talk to any OpenAI-compatible server, and Python's
json.loads raised RecursionError there, which its readers, catching ValueError, let out."""

from __future__ import annotations

import http.client
import io
from typing import cast

import pytest

from corral.chat import over_http
from corral.chat.session import ChatError

N = 50_000
DEEP = b"[" * N + b"]" * N


def _response(body: bytes) -> http.client.HTTPResponse:
    return cast(http.client.HTTPResponse, io.BytesIO(body))


def test_a_streamed_event_nested_50000_deep_is_a_chat_error() -> None:
    events = over_http._events(_response(b"data: " + DEEP + b"\n\ndata: [DONE]\n\n"))
    with pytest.raises(ChatError, match="not JSON"):
        list(events)


def test_a_refusal_nested_50000_deep_is_told_by_its_text() -> None:
    said = over_http._refusal(500, DEEP, "http://h", "m")
    assert said.startswith("http://h answered 500: [[[")
    assert over_http._code(DEEP) is None
