"""An OpenAI-compatible upstream's stream read back into the internal events
(router/generation/remote/inbound.py): as llama-server and vLLM write their chunks,
split anywhere by the network, and cut off or refused as a failing upstream answers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.generation.events import (
    Begin, Done, Event, Failed, Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart,
)
from router.generation.remote.inbound import ChunkReader, EventLines, upstream_error
from supervisor import errors as e
from worker.protocol import Usage


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, index: int = 0, **extra: Any) -> str:
    choices = [] if delta is None else [{"index": index, "delta": delta, "finish_reason": finish}]
    return json.dumps({"object": "chat.completion.chunk", "choices": choices, **extra})


USAGE = {"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 6}}
STREAM = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"reasoning_content": "Hmm."}),
    _chunk({"content": "Hi"}),
    _chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
    _chunk({"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "g", "arguments": "{}"}}]}),
    _chunk({}, "tool_calls"),
    _chunk(None, usage=USAGE),
    "[DONE]",
]


def _read(datas: list[str], chat: bool = True) -> list[Event]:
    reader = ChunkReader("m", chat)
    out = [ev for d in datas for ev in reader.feed(d)]
    return out + reader.end()


def test_a_stream_becomes_the_internal_events_with_each_call_whole() -> None:
    usage = Usage(prompt_tokens=10, completion_tokens=4, cached_tokens=6)
    assert _read(STREAM) == [
        Begin(0), ReasoningDelta(0, "Hmm."), TextDelta(0, "Hi"),
        ToolCallStart(0, 0, "c1", "f"), ToolCallDelta(0, 0, '{"a": 1}'), ToolCallEnd(0, 0),
        ToolCallStart(0, 1, "c2", "g"), ToolCallDelta(0, 1, "{}"), ToolCallEnd(0, 1),
        Finish(0, "tool_calls", usage), Done(usage),
    ]


def test_vllms_reasoning_field_and_a_text_completion_are_read_too() -> None:
    assert _read([_chunk({"reasoning": "R"}), _chunk({}, "length"), "[DONE]"])[1] == ReasoningDelta(0, "R")
    text = [json.dumps({"choices": [{"index": 0, "text": "abc", "finish_reason": None}]}),
            json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})]
    events = _read(text, chat=False)
    assert events[:2] == [Begin(0), TextDelta(0, "abc")] and isinstance(events[2], Finish) and events[2].reason == "stop"
    assert events[2].usage == Usage(prompt_tokens=0, completion_tokens=0)  # no usage sent: none made up


@pytest.mark.parametrize("datas, why", [
    ([_chunk({"content": "Half"})], "before it was complete"),  # cut: no finish_reason
    ([], "without any choice"),
    ([_chunk({"content": "a"}), "not json"], "not JSON"),
    ([_chunk({"content": "a"}), json.dumps({"error": {"message": "out of memory"}})], "out of memory"),
])
def test_an_answer_that_is_not_whole_ends_failed(datas: list[str], why: str) -> None:
    events = _read(datas)
    assert isinstance(events[-1], Failed) and why in events[-1].error.message
    assert not any(isinstance(ev, (Finish, Done)) for ev in events)


@given(st.lists(st.integers(min_value=1, max_value=40), max_size=30), st.booleans())
def test_events_split_anywhere_read_the_same(cuts: list[int], crlf: bool) -> None:
    sep = "\r\n\r\n" if crlf else "\n\n"
    raw = "".join(f"data: {d}{sep}" for d in STREAM).encode()
    lines, got, at = EventLines(), [], 0
    for n in cuts:
        got += lines.feed(raw[at:at + n])
        at += n
    got += lines.feed(raw[at:]) + lines.end()
    assert got == STREAM


def test_a_last_event_without_its_blank_line_is_kept_and_comments_are_not_data() -> None:
    lines = EventLines()
    assert lines.feed(b": keep-alive\n\nevent: x\ndata: 1\n\ndata: 2") == ["1"]
    assert lines.end() == ["2"]


@pytest.mark.parametrize("status, body, kind, param", [
    (400, {"error": {"message": "bad temperature", "param": "temperature"}}, e.InvalidRequest, "temperature"),
    (400, {"error": {"message": "too long", "code": "context_length_exceeded"}}, e.ContextOverflow, "messages"),
    (422, {"detail": "x"}, e.InvalidRequest, None),
    (401, {"error": {"message": "Incorrect API key"}}, e.WorkerCrashed, None),  # the operator's key, not the client's
    (404, {"error": {"message": "model not found"}}, e.WorkerCrashed, None),
    (429, {"error": {"message": "slow down"}}, e.Overloaded, None),
    (503, {"error": "loading"}, e.WorkerUnavailable, None),
    (500, "<html>oops</html>", e.WorkerCrashed, None),
])
def test_an_upstreams_refusal_says_whose_fault_it_is(status: int, body: Any, kind: type, param: str | None) -> None:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    err = upstream_error("m", status, raw, retry_after=3.0)
    assert type(err) is kind and err.param == param and f"answered {status}" in err.message
    if isinstance(err, e.Overloaded):
        assert err.retry_after == 3.0


def _calls(events: list[Event]) -> list[tuple[str, str, Any]]:
    starts = {ev.call: ev for ev in events if isinstance(ev, ToolCallStart)}
    return [(starts[ev.call].id, starts[ev.call].name, json.loads(ev.arguments))
            for ev in events if isinstance(ev, ToolCallDelta)]


def _tc(**fields: Any) -> str:
    return _chunk({"tool_calls": [fields]})


def test_calls_are_whole_however_their_pieces_come() -> None:
    """Found by probing the front (2026-11-27): interleaved pieces lost arguments; servers
    that number every call 0, or send no index, merged or split calls; all with a 200."""
    interleaved = [
        _tc(index=0, id="a1", function={"name": "a", "arguments": '{"x"'}),
        _tc(index=1, id="b1", function={"name": "b", "arguments": '{"y": 2}'}),
        _tc(index=0, function={"arguments": ": 1}"}),
    ]
    same_index = [_tc(index=0, id="a1", function={"name": "a", "arguments": '{"x": 1}'}),
                  _tc(index=0, id="b1", function={"name": "b", "arguments": '{"y": 2}'})]
    no_index = [_tc(id="a1", function={"name": "a", "arguments": '{"x": '}), _tc(function={"arguments": "1}"}),
                _tc(id="b1", function={"name": "b", "arguments": {"y": 2}})]  # an object, not JSON text
    for pieces in (interleaved, same_index, no_index):
        events = _read([*pieces, _chunk({}, "tool_calls"), "[DONE]"])
        assert _calls(events) == [("a1", "a", {"x": 1}), ("b1", "b", {"y": 2})], pieces


def test_what_is_not_part_of_the_answer_is_left_out() -> None:
    events = _read([
        json.dumps({"choices": [{"index": None, "delta": {"content": "A"}, "finish_reason": None}], "error": None}),
        _chunk({"content": "never asked for"}, index=1),  # a second choice of a job of one
        _chunk({}, "stop"),
        _chunk({"content": "after the end"}),
        "[DONE]",
    ])
    assert [ev for ev in events if isinstance(ev, TextDelta)] == [TextDelta(0, "A")]
    assert isinstance(events[-1], Done)


def test_a_refusal_that_is_not_json_is_quoted() -> None:
    err = upstream_error("m", 400, b"<html><body>Bad   Request</body></html>", None)
    assert "<html><body>Bad Request</body></html>" in err.message


def test_arguments_that_are_not_an_object_fail_the_answer_unless_max_tokens_cut_them() -> None:
    def answer(arguments: str, finish: str) -> list[Event]:
        return _read([
            _chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": arguments}}]}),
            _chunk({}, finish),
            _chunk(None, usage=USAGE),
        ])

    broken = answer('{"a": "tru', "tool_calls")
    assert isinstance(broken[-1], Failed) and "not a JSON object" in broken[-1].error.message
    assert isinstance(answer("[1, 2]", "stop")[-1], Failed)
    cut = answer('{"a": "tru', "length")
    assert ToolCallDelta(0, 0, '{"a": "tru') in cut and isinstance(cut[-1], Done)
    assert isinstance(answer("", "tool_calls")[-1], Done)  # no arguments: the empty object


def test_an_error_event_that_says_busy_is_a_503_or_a_429_not_a_broken_answer() -> None:
    def failure(err: dict[str, Any]) -> e.CorralError:
        ev = _read([_chunk({"role": "assistant"}), json.dumps({"error": err})])[-1]
        assert isinstance(ev, Failed)
        return ev.error

    assert type(failure({"message": "model overloaded", "type": "server_error", "code": 503})) is e.WorkerUnavailable
    assert type(failure({"message": "slow down", "code": "rate_limit_exceeded"})) is e.Overloaded
    assert type(failure({"message": "boom", "type": "server_error", "code": 500})) is e.WorkerCrashed
