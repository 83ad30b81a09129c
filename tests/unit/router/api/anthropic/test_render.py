"""router/api/anthropic/render.py: the internal events in Anthropic's shapes, checked by
the official `anthropic` SDK's own types (validated, not merely constructed) and by its
stream accumulator (anthropic/lib/streaming/_messages.py, what `messages.stream()` builds
the final message with): for any mix of thinking, text and calls, the streamed message
accumulates to exactly the whole one."""

from __future__ import annotations

import json
from typing import Any

from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from router.api.anthropic.errors import render, render_http
from router.api.anthropic.render import Reply, stream, whole
from router.generation.events import (
    Begin, Done, Event, Failed, Finish, ReasoningDelta, TextDelta,
)
from tests.unit.router.api.event_mixes import MIXES, call, play
from supervisor.errors import InvalidRequest, ModelNotFound, Overloaded, WorkerCrashed, WorkerUnavailable
from worker.protocol import Usage

USAGE = Usage(prompt_tokens=30, completion_tokens=7, cached_tokens=12)
EVENT = TypeAdapter(RawMessageStreamEvent)



def answer(*deltas: Event, reason: str = "stop", stop_type: Any = "eos", word: str = "") -> list[Event]:
    finish = Finish(0, reason, USAGE, stop_type=stop_type, stopping_word=word)  # type: ignore[arg-type]
    return [Begin(0, Usage(prompt_tokens=30, completion_tokens=0, cached_tokens=12)), *deltas, finish, Done(USAGE)]



async def sse(events: list[Event], reply: Reply) -> list[tuple[str, dict[str, Any]]]:
    """Each event's `event:` name and its data, the names checked against the data's type."""
    out = []
    async for chunk in stream(play(events), reply):
        head, data = chunk.decode().split("\n", 1)
        assert head.startswith("event: ") and data.startswith("data: ") and chunk.endswith(b"\n\n")
        obj = json.loads(data[len("data: "):])
        assert obj["type"] == head[len("event: "):]
        out.append((obj["type"], obj))
    return out


async def accumulated(events: list[Event], reply: Reply) -> Message:
    snapshot = None
    bufs: dict[int, bytes] = {}
    for kind, obj in await sse(events, reply):
        if kind in ("ping", "error"):
            continue
        ev = EVENT.validate_python(obj)  # every field the SDK requires, of its type
        snapshot = accumulate_event(event=ev, current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None
    return Message.model_validate(snapshot.model_dump(exclude_none=True))


def blocks(m: Message) -> list[dict[str, Any]]:
    return [b.model_dump(exclude_none=True) for b in m.content]


async def test_a_stream_is_anthropics_event_sequence_with_blocks_in_the_order_written() -> None:
    events = answer(
        ReasoningDelta(0, "Weather: "), ReasoningDelta(0, "call it."), TextDelta(0, "Let me look."),
        *call(0, "get_weather", '{"city": "Paris"}'), reason="tool_calls",
    )
    got = await sse(events, Reply("m"))
    kinds = [k for k, _ in got]
    assert kinds == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]
    starts = [o for k, o in got if k == "content_block_start"]
    assert [(o["index"], o["content_block"]["type"]) for o in starts] == [(0, "thinking"), (1, "text"), (2, "tool_use")]
    assert starts[2]["content_block"] == {"type": "tool_use", "id": "call_0", "name": "get_weather", "input": {}}
    deltas = [o["delta"] for k, o in got if k == "content_block_delta"]
    assert deltas[2] == {"type": "signature_delta", "signature": ""}  # before the thinking block stops
    assert deltas[-2:] == [
        {"type": "input_json_delta", "partial_json": '{"c'}, {"type": "input_json_delta", "partial_json": 'ity": "Paris"}'},
    ]
    start = got[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["model"] == "m"
    assert start["usage"] == {"input_tokens": 18, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 12}
    delta = got[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 7 and delta["usage"]["input_tokens"] == 18


async def test_whole_and_streamed_messages_agree() -> None:
    events = answer(ReasoningDelta(0, "hmm"), TextDelta(0, "Hi "), TextDelta(0, "there"))
    reply = Reply("m")
    whole_msg = Message.model_validate(json.loads(await whole(play(events), reply)))
    streamed = await accumulated(events, reply)
    assert blocks(whole_msg) == blocks(streamed) == [
        {"type": "thinking", "thinking": "hmm", "signature": ""}, {"type": "text", "text": "Hi there"},
    ]
    assert whole_msg.stop_reason == streamed.stop_reason == "end_turn"
    assert whole_msg.usage.cache_read_input_tokens == 12 and whole_msg.usage.input_tokens == 18


async def test_whitespace_before_a_call_opens_no_text_block() -> None:
    """Anthropic refuses a whitespace-only text block when a client sends the turn back
    (Claude Code does, every turn)."""
    events = answer(TextDelta(0, "\n"), TextDelta(0, "  "), *call(0, "f", "{}"), reason="tool_calls")
    got = await sse(events, Reply("m"))
    assert [o["content_block"]["type"] for k, o in got if k == "content_block_start"] == ["tool_use"]
    m = Message.model_validate(json.loads(await whole(play(events), Reply("m"))))
    assert [b.type for b in m.content] == ["tool_use"] and m.stop_reason == "tool_use"


async def test_stop_reasons_follow_anthropics_meanings() -> None:
    async def reason_of(events: list[Event], stops: tuple[str, ...] = ()) -> tuple[str | None, str | None]:
        m = Message.model_validate(json.loads(await whole(play(events), Reply("m", stops))))
        return m.stop_reason, m.stop_sequence

    assert await reason_of(answer(TextDelta(0, "a"), reason="length", stop_type="limit")) == ("max_tokens", None)
    assert await reason_of(answer(TextDelta(0, "a"), stop_type="word", word="END"), ("END",)) == ("stop_sequence", "END")
    # A stop string of the model's own config is the model ending its turn, not the client's sequence.
    assert await reason_of(answer(TextDelta(0, "a"), stop_type="word", word="<eot>"), ("END",)) == ("end_turn", None)
    assert await reason_of(answer(*call(0, "f", "{}"), reason="tool_calls")) == ("tool_use", None)


async def test_a_failure_after_the_headers_is_an_error_event_and_no_message_stop() -> None:
    events: list[Event] = [Begin(0), TextDelta(0, "Hel"), Failed(WorkerCrashed("The worker crashed."))]
    got = await sse(events, Reply("m"))
    assert got[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": "The worker crashed."}})
    assert "message_stop" not in [k for k, _ in got]


def test_errors_take_anthropics_shape_and_type_by_status() -> None:
    for exc, status, kind in (
        (InvalidRequest("Invalid 'temperature'.", "temperature"), 400, "invalid_request_error"),
        (ModelNotFound("The model `x` does not exist.", "model"), 404, "not_found_error"),
        (Overloaded("Too many.", 2.0), 429, "rate_limit_error"),
        (WorkerUnavailable("Loading failed.", retry=False), 503, "overloaded_error"),
    ):
        body, got_status, headers = render(exc)
        assert got_status == status and json.loads(body) == {
            "type": "error", "error": {"type": kind, "message": exc.message},  # each names its parameter
        }
    assert render(Overloaded("Too many.", 2.0))[2]["retry-after"] == "2"
    # Anthropic's error has no `param`: a message that does not name it gets it appended.
    assert json.loads(render(InvalidRequest("Must be positive.", "max_tokens"))[0])["error"]["message"] == (
        "Must be positive. (max_tokens)"
    )
    body, status, _ = render_http(404, "Unknown request URL: GET /v1/messages/x", "unknown_url")
    assert status == 404 and json.loads(body)["error"]["type"] == "not_found_error"


@settings(max_examples=150, deadline=None)
@given(MIXES, st.sampled_from(["stop", "length"]))
async def test_any_mix_streams_to_the_same_message_as_its_whole_answer(mix: tuple[list[Event], int], reason: str) -> None:
    events, n_calls = mix
    final = "tool_calls" if n_calls else reason
    evs = answer(*events, reason=final, stop_type="limit" if final == "length" else "eos")
    reply = Reply("m")
    whole_msg = Message.model_validate(json.loads(await whole(play(evs), reply)))
    streamed = await accumulated(evs, reply)

    assert blocks(whole_msg) == blocks(streamed)
    assert whole_msg.stop_reason == streamed.stop_reason
    assert all(b.text.strip() for b in streamed.content if b.type == "text")  # no whitespace-only block
    assert [b.id for b in streamed.content if b.type == "tool_use"] == [f"call_{i}" for i in range(n_calls)]
