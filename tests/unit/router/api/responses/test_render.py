"""router/api/responses/render.py: the internal events as OpenAI's Responses objects and
events, checked by the openai SDK's own types (validated, not merely constructed) and by
the state machine behind `client.responses.stream()` (openai/lib/streaming/responses),
which refuses an event for an item never added, a reused output index, or a stream that
does not start with response.created: for any mix of reasoning, text and calls, the
stream adds up to the whole response."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from router.api.responses.render import Reply, assistant_turn, stream, whole
from router.generation.events import (
    Begin, Done, Event, Failed, Finish, ReasoningDelta, TextDelta,
)
from tests.unit.router.api.event_mixes import MIXES, call, play
from supervisor.errors import WorkerCrashed
from worker.protocol import ChatMessage, ToolCall, Usage

USAGE = Usage(prompt_tokens=30, completion_tokens=7, cached_tokens=12)
EVENT = TypeAdapter(ResponseStreamEvent)
ECHO: dict[str, Any] = {"instructions": None, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "metadata": {}}



def answer(*deltas: Event, reason: str = "stop") -> list[Event]:
    return [Begin(0), *deltas, Finish(0, reason, USAGE), Done(USAGE)]  # type: ignore[arg-type]



async def sse(events: list[Event], reply: Reply) -> list[dict[str, Any]]:
    out = []
    async for chunk in stream(play(events), reply):
        head, data = chunk.decode().split("\n", 1)
        obj = json.loads(data[len("data: "):])
        assert head == "event: " + obj["type"] and chunk.endswith(b"\n\n")
        out.append(obj)
    return out


async def through_sdk(events: list[Event], reply: Reply) -> tuple[list[dict[str, Any]], Response | None]:
    """The events, each validated by the SDK, and the response its stream helper builds
    (None when the stream did not complete, as the helper's get_final_response raises)."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    got = await sse(events, reply)
    for obj in got:
        state.handle_event(EVENT.validate_python(obj))
    # What get_final_response() returns (openai/lib/streaming/responses/_responses.py).
    return got, state._completed_response


async def test_a_stream_is_numbered_and_finishes_each_item_before_the_next() -> None:
    events = answer(ReasoningDelta(0, "think"), TextDelta(0, "Hi"), *call(0, "f", '{"a": 1}'), reason="tool_calls")
    got, final = await through_sdk(events, Reply("m", ECHO))
    assert [o["sequence_number"] for o in got] == list(range(len(got)))
    assert [o["type"] for o in got] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]
    assert got[0]["response"]["status"] == "in_progress" and got[0]["response"]["output"] == []
    assert final is not None and final.status == "completed" and final.output_text == "Hi"
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    fc = final.output[2]
    assert fc.type == "function_call" and (fc.call_id, fc.name, fc.arguments) == ("call_0", "f", '{"a": 1}')
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens == 12
    assert final.usage.total_tokens == 37


async def test_a_cut_answer_is_incomplete_not_completed() -> None:
    """OpenAI's reference: max_output_tokens ends a response `incomplete` (llama-server
    says completed, which hides that the answer was cut)."""
    events = answer(TextDelta(0, "Hel"), reason="length")
    got, final = await through_sdk(events, Reply("m", ECHO))
    assert final is None and got[-1]["type"] == "response.incomplete"
    r = Response.model_validate(got[-1]["response"])
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.output[0].status == "incomplete"  # type: ignore[union-attr]
    assert json.loads(await whole(play(events), Reply("m", ECHO)))["status"] == "incomplete"


async def test_a_call_that_max_output_tokens_cut_is_incomplete() -> None:
    """Found by probing the translation: the response was `incomplete` but its cut
    function_call item said `completed`, with arguments that are not JSON."""
    events = answer(*call(0, "f", '{"city": "Pa'), reason="length")
    got, _ = await through_sdk(events, Reply("m", ECHO))
    r = Response.model_validate(got[-1]["response"])
    assert r.status == "incomplete" and r.output[0].type == "function_call" and r.output[0].status == "incomplete"
    whole_call = json.loads(await whole(play(answer(*call(0, "f", '{"a": 1}'), reason="tool_calls")), Reply("m", ECHO)))
    assert whole_call["output"][0]["status"] == "completed"


async def test_a_failure_after_the_headers_is_response_failed_with_its_error() -> None:
    events: list[Event] = [Begin(0), TextDelta(0, "Hel"), Failed(WorkerCrashed("The worker crashed."))]
    got, final = await through_sdk(events, Reply("m", ECHO))
    assert final is None and got[-1]["type"] == "response.failed"
    r = Response.model_validate(got[-1]["response"])
    assert r.status == "failed" and r.error is not None and r.error.message == "The worker crashed."
    assert "error" not in got[-1]  # a top-level "error" makes the SDK raise APIError instead


async def test_a_kept_response_is_the_answer_as_sent_and_its_turn() -> None:
    kept: list[tuple[dict[str, Any], ChatMessage]] = []
    reply = Reply("m", ECHO, keep=lambda obj, turn: kept.append((obj, turn)))
    body = json.loads(await whole(play(answer(ReasoningDelta(0, "r"), TextDelta(0, "x"), *call(0, "f", "{}"), reason="tool_calls")), reply))
    (obj, turn), = kept
    assert obj == body
    assert turn == ChatMessage(role="assistant", content="x", tool_calls=[ToolCall(id="call_0", name="f", arguments="{}")], reasoning_content="r")
    assert assistant_turn([]) == ChatMessage(role="assistant", content="")


@settings(max_examples=150, deadline=None)
@given(MIXES)
async def test_any_mix_streams_to_the_same_response_as_its_whole_answer(mix: tuple[list[Event], int]) -> None:
    events, n_calls = mix
    evs = answer(*events, reason="tool_calls" if n_calls else "stop")
    reply = Reply("m", ECHO)
    body = Response.model_validate(json.loads(await whole(play(evs), reply)))
    _, final = await through_sdk(evs, reply)
    assert final is not None

    def items(r: Response) -> Any:
        # The helper adds what it parsed (`parsed`, `parsed_arguments`); ids are new per run.
        def strip(v: Any) -> Any:
            if isinstance(v, dict):
                return {k: strip(x) for k, x in v.items() if k not in ("parsed", "parsed_arguments", "id")}
            return [strip(x) for x in v] if isinstance(v, list) else v

        return strip([o.model_dump() for o in r.output])

    assert items(final) == items(body)
    assert all(
        c.text.strip() for o in body.output if o.type == "message" for c in o.content if c.type == "output_text"
    )
    assert [o.call_id for o in body.output if o.type == "function_call"] == [f"call_{i}" for i in range(n_calls)]
