"""Request ids, the access log's line, and JSON log records."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from router.server.access_log import Record, line, request_id
from worker.log_format import JsonFormatter
from worker.request import Request
from worker.stops import StopMatcher
from worker.protocol import SamplingParams


@pytest.mark.parametrize("sent", ["abc", "req-42", "0f3c2a9e7b1d4c5e8f6a7b8c9d0e1f2a", "trace:span/7+x=y@z"])
def test_a_plain_client_id_is_kept(sent: str) -> None:
    assert request_id(sent) == sent


@pytest.mark.parametrize("sent", [None, "", "has space", "new\nline", 'quote"', "x" * 129, "é", "a;b"])
def test_anything_else_gets_a_new_id(sent: str | None) -> None:
    made = request_id(sent)
    assert made != sent and len(made) == 32 and int(made, 16) >= 0
    assert request_id(sent) != made  # a new one each time


def _record(**kw: object) -> Record:
    r = Record(id="r1", client="10.0.0.7", method="POST", path="/v1/chat/completions", started=100.0)
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_a_finished_generation_line() -> None:
    r = _record(key="alice", model="gemma", status=200, prompt_tokens=12, generated_tokens=16, first_token=100.25, complete=True)
    f = r.fields(101.5)
    assert f == {
        "request_id": "r1", "client": "10.0.0.7", "key": "alice", "model": "gemma", "upstream": None,
        "method": "POST", "endpoint": "/v1/chat/completions", "status": 200,
        "prompt_tokens": 12, "generated_tokens": 16, "ttft": 0.25, "duration": 1.5, "client_gone": False, "upstream_broke": False,
    }
    assert line(f) == 'r1 10.0.0.7 key=alice model=gemma "POST /v1/chat/completions" 200 prompt=12 generated=16 ttft=0.250s 1.500s'


def test_a_relayed_request_names_the_replica_that_answered() -> None:
    f = _record(model="qwen", upstream="http://10.0.0.2:8080/v1", status=200, complete=True).fields(100.5)
    assert f["upstream"] == "http://10.0.0.2:8080/v1"
    assert line(f) == 'r1 10.0.0.7 key=- model=qwen upstream=http://10.0.0.2:8080/v1 "POST /v1/chat/completions" 200 0.500s'


def test_a_request_without_tokens_or_key_and_a_client_that_left() -> None:
    f = _record(status=None).fields(100.004)
    assert line(f) == 'r1 10.0.0.7 key=- model=- "POST /v1/chat/completions" - 0.004s client-gone'


def test_json_records_carry_their_fields_and_exceptions() -> None:
    fmt = JsonFormatter(model="gemma")
    record = logging.LogRecord("corral.access", logging.INFO, __file__, 1, "%s", ("hello",), None)
    record.fields = {"request_id": "r1", "status": 200}
    obj = json.loads(fmt.format(record))
    assert obj["message"] == "hello" and obj["level"] == "info" and obj["logger"] == "corral.access"
    assert obj["model"] == "gemma" and obj["request_id"] == "r1" and obj["status"] == 200
    assert obj["time"].endswith("+00:00")
    try:
        raise ValueError("multi\nline")
    except ValueError:
        failed = logging.LogRecord("w", logging.ERROR, __file__, 1, "boom", (), sys.exc_info())
    text = fmt.format(failed)
    assert "\n" not in text and "ValueError: multi" in json.loads(text)["exception"]


def test_worker_log_lines_name_the_http_request() -> None:
    def req(request_id: str | None) -> Request:
        return Request(id=7, params=SamplingParams(), prompt=[1], max_new=1, stops=StopMatcher(()), request_id=request_id)

    assert req("abc").label == "7 (abc)"
    assert req(None).label == "7"
    r = req("abc")
    r.n = 2
    assert [s.request_id for s in r.siblings()] == ["abc"]
