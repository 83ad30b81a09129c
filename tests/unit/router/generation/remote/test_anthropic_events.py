"""An Anthropic Messages stream read back into the internal events
(router/generation/remote/anthropic_events.py). The events are those of Anthropic's
streaming reference (docs.anthropic.com/en/api/messages-streaming), split anywhere by the
network, and cut off or failed as a failing upstream answers."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from router.generation.events import (
    Begin, Done, Event, Failed, Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart,
)
from router.generation.remote.anthropic_events import MessageReader
from router.generation.remote.inbound import EventLines, upstream_error
from supervisor import errors as e
from worker.protocol import Usage


def _ev(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields})


START = _ev("message_start", message={
    "id": "msg_1", "type": "message", "role": "assistant", "content": [], "stop_reason": None,
    "usage": {"input_tokens": 4, "cache_read_input_tokens": 6, "cache_creation_input_tokens": 0, "output_tokens": 1},
})
STREAM = [
    START,
    _ev("ping"),
    _ev("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""}),
    _ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "Hmm."}),
    _ev("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "abc"}),
    _ev("content_block_stop", index=0),
    _ev("content_block_start", index=1, content_block={"type": "text", "text": ""}),
    _ev("content_block_delta", index=1, delta={"type": "text_delta", "text": "Hi"}),
    _ev("content_block_stop", index=1),
    _ev("content_block_start", index=2, content_block={"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}),
    _ev("content_block_delta", index=2, delta={"type": "input_json_delta", "partial_json": ""}),
    _ev("content_block_delta", index=2, delta={"type": "input_json_delta", "partial_json": '{"a": '}),
    _ev("content_block_delta", index=2, delta={"type": "input_json_delta", "partial_json": "1}"}),
    _ev("content_block_stop", index=2),
    _ev("message_delta", delta={"stop_reason": "tool_use", "stop_sequence": None}, usage={"output_tokens": 9}),
    _ev("message_stop"),
]
USAGE = Usage(prompt_tokens=10, completion_tokens=9, cached_tokens=6)


def _read(datas: list[str]) -> list[Event]:
    reader = MessageReader("m")
    return [ev for d in datas for ev in reader.feed(d)] + reader.end()


def test_a_stream_becomes_the_internal_events() -> None:
    # Anthropic's input_tokens leave out the cached part, which the internal usage counts.
    assert _read(STREAM) == [
        Begin(0, Usage(prompt_tokens=10, completion_tokens=0, cached_tokens=6)),
        ReasoningDelta(0, "Hmm."),
        TextDelta(0, "Hi"),
        ToolCallStart(0, 0, "toolu_1", "f"), ToolCallDelta(0, 0, '{"a": 1}'), ToolCallEnd(0, 0),
        Finish(0, "tool_calls", USAGE, stop_type="eos"),
        Done(USAGE),
    ]


def test_stop_reasons_keep_their_meaning_and_the_stop_sequence_its_word() -> None:
    def ending(reason: str, word: str | None = None) -> Finish:
        events = _read([
            START,
            _ev("content_block_start", index=0, content_block={"type": "text", "text": "Lead "}),
            _ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "text"}),
            _ev("content_block_stop", index=0),
            _ev("message_delta", delta={"stop_reason": reason, "stop_sequence": word}, usage={"output_tokens": 2}),
            _ev("message_stop"),
        ])
        assert [ev.text for ev in events if isinstance(ev, TextDelta)] == ["Lead ", "text"]
        finish = events[-2]
        assert isinstance(finish, Finish)
        return finish

    assert (ending("end_turn").reason, ending("end_turn").stop_type) == ("stop", "eos")
    stopped = ending("stop_sequence", "END")
    assert (stopped.reason, stopped.stop_type, stopped.stopping_word) == ("stop", "word", "END")
    assert (ending("max_tokens").reason, ending("max_tokens").stop_type) == ("length", "limit")
    assert ending("refusal").reason == "stop"
    assert ending("a_reason_not_yet_invented").reason == "stop"


def test_a_tool_use_block_whose_input_came_whole_at_its_start_keeps_it() -> None:
    events = _read([
        START,
        _ev("content_block_start", index=0, content_block={"type": "tool_use", "id": "t", "name": "g", "input": {"x": 2}}),
        _ev("content_block_stop", index=0),
        _ev("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 3}),
        _ev("message_stop"),
    ])
    assert ToolCallDelta(0, 0, '{"x": 2}') in events


def test_a_cut_stream_or_an_error_event_fails_never_ends_as_whole() -> None:
    for cut in range(1, len(STREAM)):  # message_stop never came
        events = _read(STREAM[:cut])
        assert isinstance(events[-1], Failed), cut
        assert not any(isinstance(ev, (Finish, Done)) for ev in events), cut
    failed = _read([*STREAM[:4], _ev("error", error={"type": "overloaded_error", "message": "Overloaded"})])
    assert isinstance(failed[-1], Failed) and "Overloaded" in failed[-1].error.message
    assert isinstance(_read(["not json"])[-1], Failed)
    assert isinstance(_read([])[-1], Failed)


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=60))
def test_the_stream_split_anywhere_reads_the_same(cuts: list[int]) -> None:
    wire = "".join(f"event: {json.loads(d)['type']}\ndata: {d}\n\n" for d in STREAM).encode()
    lines, reader, events = EventLines(), MessageReader("m"), []
    at = 0
    for n in cuts:
        for d in lines.feed(wire[at : at + n]):
            events += reader.feed(d)
        at += n
    for d in lines.feed(wire[at:]) + lines.end():
        events += reader.feed(d)
    assert events + reader.end() == _read(STREAM)


def test_anthropics_error_answers_keep_whose_fault_they_are() -> None:
    def body(kind: str, message: str) -> bytes:
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()

    too_long = upstream_error("m", 400, body("invalid_request_error", "prompt is too long: 210000 tokens > 200000"), None)
    assert isinstance(too_long, e.ContextOverflow) and "210000" in too_long.message
    refused = upstream_error("m", 400, body("invalid_request_error", "temperature: range: 0..1"), None)
    assert type(refused) is e.InvalidRequest and "temperature" in refused.message
    overloaded = upstream_error("m", 529, body("overloaded_error", "Overloaded"), None)
    assert isinstance(overloaded, e.WorkerUnavailable)
    key = upstream_error("m", 401, body("authentication_error", "invalid x-api-key"), None)
    assert type(key) is e.WorkerCrashed and "api_key_env" in key.message


def test_an_overloaded_or_rate_limited_event_is_a_busy_upstream_not_a_broken_one() -> None:
    """Anthropic's streaming reference: an `overloaded_error` event is what a 529 is
    outside a stream. Found by probing: it was read as a broken answer, a 502 that took
    the replica out of rotation after three."""
    def failure(kind: str) -> e.CorralError:
        ev = _read([START, _ev("error", error={"type": kind, "message": "busy"})])[-1]
        assert isinstance(ev, Failed)
        return ev.error

    assert type(failure("overloaded_error")) is e.WorkerUnavailable
    assert type(failure("rate_limit_error")) is e.Overloaded
    assert type(failure("api_error")) is e.WorkerCrashed


def test_input_that_is_not_an_object_or_a_delta_of_no_block_fails_unless_max_tokens_cut_it() -> None:
    """Found by probing: a piece of input for a block that was never opened was dropped,
    and input cut mid-string passed as a whole call with a 200 (Ollama's client then read
    `{"arguments": "{\\"city\\": \\"Par"}` as the call's arguments)."""
    def answer(pieces: list[str], reason: str, index: int = 0) -> list[Event]:
        return _read([
            START,
            _ev("content_block_start", index=0, content_block={"type": "tool_use", "id": "t", "name": "w", "input": {}}),
            *[_ev("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": p}) for p in pieces],
            _ev("content_block_stop", index=0),
            _ev("message_delta", delta={"stop_reason": reason}, usage={"output_tokens": 5}),
            _ev("message_stop"),
        ])

    cut = answer(['{"city": ', '"Par'], "tool_use")
    assert isinstance(cut[-1], Failed) and "not a JSON object" in cut[-1].error.message
    assert not any(isinstance(ev, ToolCallStart) for ev in cut)
    stray = answer(['{"city": "Paris"}'], "tool_use", index=7)
    assert isinstance(stray[-1], Failed) and "not open" in stray[-1].error.message
    limited = answer(['{"city": ', '"Par'], "max_tokens")  # the length's: given as it came
    assert ToolCallDelta(0, 0, '{"city": "Par') in limited and isinstance(limited[-2], Finish)
    assert limited[-2].reason == "length"  # type: ignore[union-attr]
