"""router/api/openai/errors.py (with router/server/errors.py's statuses and headers) and
router/api/openai/shapes.py: OpenAI's error and response shapes."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest

from router.api.openai import errors as re_
from router.api.openai.shapes import DONE, Completion, usage_json
from router.generation.answer import ChoiceAnswer
from router.generation.events import Finish, Reason
from router.server import errors as server_errors
from router.server.errors import http_problem
from supervisor import errors as e
from supervisor.replies import WORKER_ERRORS
from worker.protocol import ErrorCode, Usage

# ---- errors -------------------------------------------------------------------------------------


def one(text: str, reason: Reason) -> list[ChoiceAnswer]:
    """A whole answer of one choice that said `text`."""
    return [ChoiceAnswer(0, parts=[text], finish=Finish(0, reason, Usage(prompt_tokens=0, completion_tokens=0)))]


@pytest.mark.parametrize(
    ("exc", "status", "type_", "code"),
    [
        (e.InvalidRequest("bad", "temperature"), 400, "invalid_request_error", None),
        (e.Unsupported("nope", "tools"), 400, "invalid_request_error", "unsupported_parameter"),
        (
            e.ContextOverflow("too long", "messages"),
            400,
            "invalid_request_error",
            "context_length_exceeded",
        ),
        (
            e.ModelNotFound("no such model", "model"),
            404,
            "invalid_request_error",
            "model_not_found",
        ),
        (e.WorkerUnavailable("loading failed"), 503, "server_error", "model_unavailable"),
        (e.WorkerCrashed("worker died"), 502, "server_error", "worker_crashed"),
        (e.InternalError("bug"), 500, "server_error", "internal_error"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None,
)
def test_error_mapping(exc: e.CorralError, status: int, type_: str, code: str | None) -> None:
    h = re_.classify(exc)
    assert (h.status, h.type, h.code) == (status, type_, code)
    raw, got_status, headers = re_.render(exc)
    assert got_status == status
    assert headers["content-type"] == "application/json"
    assert json.loads(raw) == {
        "error": {"message": exc.message, "type": type_, "param": exc.param, "code": code}
    }


def test_every_error_class_is_mapped() -> None:
    classes = [
        c
        for c in vars(e).values()
        if isinstance(c, type) and issubclass(c, e.CorralError) and c is not e.CorralError
    ]
    assert classes
    for cls in classes:
        assert cls in re_._KIND and cls in server_errors._STATUS, cls


def test_subclass_maps_like_its_base() -> None:
    class Special(e.ModelNotFound):
        pass

    assert re_.classify(Special("x")).status == 404


def test_base_error_maps_to_internal() -> None:
    h = re_.classify(e.CorralError("?"))
    assert (h.status, h.type) == (500, "server_error")


@pytest.mark.parametrize(("retry", "header"), [(True, "true"), (False, "false")])
def test_worker_unavailable_retry_header(retry: bool, header: str) -> None:
    _, status, headers = re_.render(e.WorkerUnavailable("down", retry=retry))
    assert status == 503
    assert headers["x-should-retry"] == header


def test_worker_unavailable_retry_defaults_true() -> None:
    assert e.WorkerUnavailable("down").retry is True
    assert re_.render(e.WorkerUnavailable("down"))[2]["x-should-retry"] == "true"


@pytest.mark.parametrize(("after", "header"), [(5.0, "5"), (69.2, "70"), (0.2, "1")])
def test_retry_after_is_whole_seconds_rounded_up(after: float, header: str) -> None:
    headers = re_.render(e.WorkerUnavailable("full", retry_after=after))[2]
    assert headers["retry-after"] == header and headers["x-should-retry"] == "true"


def test_no_retry_after_when_retrying_is_pointless_or_unknown() -> None:
    assert "retry-after" not in re_.render(e.WorkerUnavailable("down"))[2]
    assert "retry-after" not in re_.render(e.WorkerUnavailable("x", retry=False, retry_after=3))[2]


@pytest.mark.parametrize(
    "exc", [e.InvalidRequest("x"), e.WorkerCrashed("x"), e.ModelNotFound("x"), e.InternalError("x")]
)
def test_no_retry_header_for_other_errors(exc: e.CorralError) -> None:
    assert "x-should-retry" not in re_.render(exc)[2]


def test_envelope_always_has_all_four_keys() -> None:
    env = re_.envelope("m", "t", None, None)
    assert env == {"error": {"message": "m", "type": "t", "param": None, "code": None}}
    raw, _, _ = re_.render(e.InvalidRequest("no param"))
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] is None and err["code"] is None


def test_sse_error_event() -> None:
    raw = re_.error_event(e.WorkerCrashed("worker died mid-stream"))
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    assert raw.count(b"\n") == 2
    err = json.loads(raw[len(b"data: ") : -2])["error"]
    assert err == {
        "message": "worker died mid-stream",
        "type": "server_error",
        "param": None,
        "code": "worker_crashed",
    }


@pytest.mark.parametrize(
    ("status", "type_"),
    [
        (404, "invalid_request_error"),
        (405, "invalid_request_error"),
        (413, "invalid_request_error"),
        (500, "server_error"),
    ],
)
def test_http_status(status: int, type_: str) -> None:
    raw, got, headers = re_.http_status(status, "msg", "code_x")
    assert got == status
    assert headers == {"content-type": "application/json"}
    assert json.loads(raw) == {
        "error": {"message": "msg", "type": type_, "param": None, "code": "code_x"}
    }


def test_error_message_with_unicode_and_quotes() -> None:
    raw, _, _ = re_.render(e.InvalidRequest('bad "value" – ünïcode', "x"))
    assert json.loads(raw)["error"]["message"] == 'bad "value" – ünïcode'


# ---- openai_format ------------------------------------------------------------------------------


def parse_event(raw: bytes) -> dict[str, Any]:
    assert raw.startswith(b"data: "), raw
    assert raw.endswith(b"\n\n"), raw
    payload = raw[len(b"data: ") : -2]
    assert b"\n" not in payload
    return json.loads(payload)


USAGE = Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=3)


def test_usage_json() -> None:
    assert usage_json(USAGE) == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 3},
    }
    assert usage_json(None) == {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_ids_have_prefix_and_are_unique() -> None:
    chat_ids = {Completion("m", chat=True).id for _ in range(50)}
    assert len(chat_ids) == 50
    assert all(i.startswith("chatcmpl-") for i in chat_ids)
    assert Completion("m", chat=False).id.startswith("cmpl-")


def test_chat_whole() -> None:
    c = Completion("my-model", chat=True)
    obj = json.loads(c.whole(one("Hello!", "stop"), USAGE, logprobs=False))
    assert obj["id"] == c.id
    assert obj["object"] == "chat.completion"
    assert type(obj["created"]) is int
    assert obj["created"] == c.created
    assert obj["model"] == "my-model"
    assert "system_fingerprint" in obj
    assert len(obj["choices"]) == 1
    choice = obj["choices"][0]
    assert choice["index"] == 0
    assert choice["message"] == {"role": "assistant", "content": "Hello!", "refusal": None}
    assert "logprobs" in choice and choice["logprobs"] is None
    assert choice["finish_reason"] == "stop"
    assert obj["usage"]["total_tokens"] == 15


def test_completion_whole() -> None:
    c = Completion("m", chat=False)
    obj = json.loads(c.whole(one("text out", "length"), None, logprobs=False))
    assert obj["object"] == "text_completion"
    assert type(obj["created"]) is int
    choice = obj["choices"][0]
    assert choice == {"index": 0, "text": "text out", "logprobs": None, "finish_reason": "length"}
    assert obj["usage"]["total_tokens"] == 0


def test_created_is_int_even_if_time_is_float(monkeypatch: pytest.MonkeyPatch) -> None:
    import router.api.openai.shapes as of

    monkeypatch.setattr(of.time, "time", lambda: 1700000000.75)
    c = Completion("m", chat=True)
    assert c.created == 1700000000
    assert json.loads(c.whole(one("", "stop"), None, logprobs=False))["created"] == 1700000000
    assert parse_event(c.chunk("x"))["created"] == 1700000000


def test_chat_chunk_first_has_role() -> None:
    c = Completion("m", chat=True)
    first = parse_event(c.chunk("", first=True))
    assert first["object"] == "chat.completion.chunk"
    assert first["id"] == c.id
    assert type(first["created"]) is int
    choice = first["choices"][0]
    assert choice["delta"] == {"role": "assistant", "content": None}
    assert choice["logprobs"] is None and "logprobs" in choice
    assert choice["finish_reason"] is None and "finish_reason" in choice


def test_chat_chunk_later_has_no_role() -> None:
    c = Completion("m", chat=True)
    later = parse_event(c.chunk("world"))
    assert later["choices"][0]["delta"] == {"content": "world"}


def test_chat_chunk_final_with_finish_reason() -> None:
    c = Completion("m", chat=True)
    last = parse_event(c.chunk(None, "stop"))
    assert last["choices"][0]["delta"] == {}
    assert last["choices"][0]["finish_reason"] == "stop"


def test_chunks_share_id_and_created() -> None:
    c = Completion("m", chat=True)
    events = [
        parse_event(x)
        for x in (
            c.chunk("", first=True),
            c.chunk("a"),
            c.chunk(None, "stop"),
            c.usage_chunk(USAGE),
        )
    ]
    assert {ev["id"] for ev in events} == {c.id}
    assert {ev["created"] for ev in events} == {c.created}
    assert {ev["model"] for ev in events} == {"m"}


def test_completion_chunk() -> None:
    c = Completion("m", chat=False)
    ev = parse_event(c.chunk("abc"))
    assert ev["object"] == "text_completion"
    assert ev["choices"][0] == {"index": 0, "text": "abc", "logprobs": None, "finish_reason": None}
    ev = parse_event(c.chunk(None, "length"))
    assert ev["choices"][0]["text"] == ""
    assert ev["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("chat", [True, False])
def test_usage_chunk(chat: bool) -> None:
    c = Completion("m", chat=chat)
    ev = parse_event(c.usage_chunk(USAGE))
    assert ev["choices"] == []
    assert ev["usage"]["prompt_tokens"] == 10
    assert ev["usage"]["total_tokens"] == 15
    assert ev["object"] == ("chat.completion.chunk" if chat else "text_completion")
    assert type(ev["created"]) is int


def test_chunk_text_with_newlines_stays_on_one_sse_line() -> None:
    c = Completion("m", chat=True)
    ev = parse_event(c.chunk("line1\nline2\n\n", first=True))
    assert ev["choices"][0]["delta"]["content"] == "line1\nline2\n\n"


def test_done_sentinel() -> None:
    assert DONE == b"data: [DONE]\n\n"


# ---- the worker's error codes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "retry"),
    [
        ("context_length_exceeded", 400, None),
        ("invalid_request", 400, None),
        ("unsupported", 400, None),
        # A Generate that crossed the worker's Shutdown (the race llama-swap #946 shows for a
        # request during a stop): a new worker takes it, so the client may send it again.
        ("unavailable", 503, "true"),
        ("internal", 500, None),
    ],
)
def test_every_worker_error_code_has_its_http_answer(code: str, status: int, retry: str | None) -> None:
    """Issue 9, item 6 (5eaed59): a request that crossed a worker's Shutdown was a 500."""
    exc = WORKER_ERRORS[code]("the message", "prompt" if status == 400 else None)
    body, got_status, headers = re_.render(exc)
    assert got_status == status
    assert headers.get("x-should-retry") == retry
    if retry:
        assert headers["retry-after"] == "1"
    assert json.loads(body)["error"]["message"] == "the message"


def test_every_error_code_of_the_protocol_is_mapped() -> None:
    assert set(WORKER_ERRORS) == set(get_args(ErrorCode))


@pytest.mark.parametrize(
    ("status", "code", "needle"),
    [
        (404, "unknown_url", "Unknown request URL: GET /v1/nope"),
        (405, "method_not_allowed", "Method GET is not allowed on /v1/nope"),
        (413, "request_too_large", "exceeds 1024 bytes"),
        (400, None, "bad things"),
    ],
)
def test_http_level_errors_use_the_openai_envelope(status: int, code: str | None, needle: str) -> None:
    raw, got, headers = re_.http_status(status, *http_problem(status, "GET", "/v1/nope", "bad things", 1024))
    err = json.loads(raw)["error"]
    assert got == status and headers["content-type"] == "application/json"
    assert needle in err["message"] and err["code"] == code
    assert err["type"] == "invalid_request_error"


def test_a_refused_config_is_a_400_listing_every_problem() -> None:
    from supervisor.config import ConfigError

    raw, status, _ = re_.render_config_error(ConfigError(["a: bad", "b: worse"], "x.toml"))
    err = json.loads(raw)["error"]
    assert status == 400 and err["code"] == "invalid_config"
    assert err["message"] == "a: bad; b: worse"
    assert err["problems"] == ["a: bad", "b: worse"]  # one a line for `corral reload`
