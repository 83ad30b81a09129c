"""router/api/ollama/render.py: the internal events in Ollama's shapes, validated by the
official `ollama` client's own response models (ollama/_types.py), as it parses them."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

import pytest
from ollama import ChatResponse, GenerateResponse

from router.api.ollama.errors import render, render_http
from router.api.ollama.render import Reply, lines, whole
from router.generation.answer import arguments
from router.generation.events import (
    Begin, Done, Event, Failed, Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart,
)
from supervisor.errors import Forbidden, ModelNotFound, Overloaded, WorkerCrashed
from worker.protocol import Timings, Usage

USAGE = Usage(prompt_tokens=11, completion_tokens=4)
TIMINGS = Timings(prompt_n=11, prompt_ms=20.0, predicted_n=4, predicted_ms=40.0)


async def play(events: list[Event]) -> AsyncIterator[Event]:
    for ev in events:
        yield ev


def answer(*deltas: Event, reason: str = "stop") -> list[Event]:
    return [Begin(0), *deltas, Finish(0, reason, USAGE, TIMINGS), Done(USAGE)]  # type: ignore[arg-type]


async def test_a_streamed_chat_is_one_json_object_a_line_ending_with_the_counts() -> None:
    body = b"".join([c async for c in lines(play(answer(
        ReasoningDelta(0, "hmm"), TextDelta(0, "Hel"), TextDelta(0, ""), TextDelta(0, "lo", last=True),
    )), Reply("m:latest", chat=True))])
    assert body.endswith(b"\n") and b"\n\n" not in body
    objs = [json.loads(x) for x in body.decode().splitlines()]
    parsed = [ChatResponse.model_validate(o) for o in objs]
    assert [p.message.thinking for p in parsed[:1]] == ["hmm"]
    assert "".join(p.message.content or "" for p in parsed) == "Hello"
    assert [p.done for p in parsed] == [False, False, False, True]
    last = objs[-1]
    assert last["done_reason"] == "stop" and last["message"] == {"role": "assistant", "content": ""}
    assert (last["prompt_eval_count"], last["eval_count"]) == (11, 4)
    assert (last["prompt_eval_duration"], last["eval_duration"]) == (20_000_000, 40_000_000)
    assert last["total_duration"] >= 0 and last["model"] == "m:latest" and last["created_at"].endswith("Z")


async def test_a_tool_call_comes_whole_in_one_line_with_object_arguments() -> None:
    events = answer(
        ToolCallStart(0, 0, "call_1", "get_weather"), ToolCallDelta(0, 0, '{"city":'), ToolCallDelta(0, 0, ' "Paris"}'),
        ToolCallEnd(0, 0), reason="tool_calls",
    )
    objs = [json.loads(x) async for x in lines(play(events), Reply("m", chat=True))]
    (call_line,) = [o for o in objs if o["message"].get("tool_calls")]
    call = ChatResponse.model_validate(call_line).message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert objs[-1]["done_reason"] == "stop"  # Ollama ends a reply with calls as "stop"
    whole_body = json.loads(await whole(play(events), Reply("m", chat=True)))
    msg = ChatResponse.model_validate(whole_body).message
    assert msg.tool_calls is not None and msg.tool_calls[0].function.arguments == {"city": "Paris"}


def test_arguments_that_are_not_an_object_are_kept() -> None:
    assert arguments('{"a": 1}') == {"a": 1}
    assert arguments('"Paris"') == {"arguments": "Paris"}
    assert arguments("not json") == {"arguments": "not json"}


async def test_a_whole_generate_holds_the_response_and_why_it_ended() -> None:
    body = json.loads(await whole(play(answer(TextDelta(0, "Hi"), TextDelta(0, " there", last=True), reason="length")),
                                  Reply("m", chat=False)))
    resp = GenerateResponse.model_validate(body)
    assert resp.response == "Hi there" and resp.done is True and resp.done_reason == "length"
    assert "message" not in body


async def test_a_failure_mid_stream_is_a_last_error_line() -> None:
    objs = [json.loads(x) async for x in lines(play([Begin(0), TextDelta(0, "a"), Failed(WorkerCrashed("died"))]),
                                                Reply("m", chat=True))]
    assert objs[-1] == {"error": "died"} and not any(o.get("done") for o in objs)


async def test_a_whole_answer_that_failed_raises() -> None:
    with pytest.raises(WorkerCrashed):
        await whole(play([Begin(0), Failed(WorkerCrashed("died"))]), Reply("m", chat=True))


@pytest.mark.parametrize(("exc", "status"), [(ModelNotFound("no such model", "model"), 404), (Overloaded("full", 2.0), 429)])
def test_errors_are_ollamas_object_with_every_dialects_status(exc: Any, status: int) -> None:
    body, got, headers = render(exc)
    assert (json.loads(body), got) == ({"error": exc.message}, status)
    if status == 429:
        assert headers["retry-after"] == "2"
    body, _, _ = render(Forbidden("requests from the web page at 'https://evil.example' are not allowed", "Origin"))
    assert json.loads(body)["error"].endswith("(Origin)")  # the one field names what to fix
    body, got, _ = render_http(405, "Method GET is not allowed on /api/chat", "method_not_allowed")
    assert (json.loads(body), got) == ({"error": "Method GET is not allowed on /api/chat"}, 405)
