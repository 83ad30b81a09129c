"""router/generation/answer.py and stream.py's merged_usage: a whole answer gathered from
the internal events, and the usage of n choices over several prompts (issue 10, item 4)."""

from __future__ import annotations

import pytest

from router.generation.answer import Answer
from router.generation.events import (
    Begin, Done, Failed, Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart,
)
from router.generation.stream import merged_usage
from supervisor.errors import WorkerCrashed
from worker.protocol import TokenLogprob, Usage


def tok(piece: bytes) -> TokenLogprob:
    return TokenLogprob(token=9, piece=piece, logprob=-0.5, top=[])


def test_usage_counts_each_prompt_once_and_sums_completions() -> None:
    finals = {
        0: Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=4),
        1: Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=10),  # shared the prompt
        2: Usage(prompt_tokens=7, completion_tokens=1, cached_tokens=0),
        3: Usage(prompt_tokens=7, completion_tokens=2, cached_tokens=7),
    }
    assert merged_usage(finals, n=2) == Usage(prompt_tokens=17, completion_tokens=11, cached_tokens=4)
    assert merged_usage({0: finals[0]}, n=1) == finals[0]


def test_an_answer_collects_text_echo_and_logprobs_by_choice() -> None:
    a = Answer()
    two = Usage(prompt_tokens=2, completion_tokens=2)
    for ev in [
        Begin(0), Begin(1),
        TextDelta(1, "x", tokens=(5,), echo="P:", logprobs=(tok(b"x"),)),
        TextDelta(0, "a"),
        TextDelta(1, "y", last=True), Finish(1, "stop", two),
        TextDelta(0, "b", last=True), Finish(0, "length", two),
        Done(Usage(prompt_tokens=2, completion_tokens=4)),
    ]:
        a.add(ev)
    first, second = a.ordered()
    assert (first.index, first.text, first.finish and first.finish.reason) == (0, "ab", "length")
    assert (second.index, second.text, second.content, len(second.logprobs), second.tokens) == (1, "P:xy", "xy", 1, [5])
    assert a.usage == Usage(prompt_tokens=2, completion_tokens=4)


def test_an_answer_keeps_reasoning_and_calls_apart_from_content() -> None:
    a = Answer()
    for ev in [
        ReasoningDelta(0, "hmm"), TextDelta(0, "Sure."),
        ToolCallStart(0, 0, "call_1", "f"), ToolCallDelta(0, 0, '{"a":'), ToolCallDelta(0, 0, " 1}"), ToolCallEnd(0, 0),
        Finish(0, "tool_calls", Usage(prompt_tokens=1, completion_tokens=9)),
    ]:
        a.add(ev)
    (c,) = a.ordered()
    assert (c.reasoning, c.content) == ("hmm", "Sure.")
    assert [(t.id, t.name, t.arguments) for t in c.calls] == [("call_1", "f", '{"a": 1}')]


def test_a_failed_stream_is_no_whole_answer() -> None:
    a = Answer()
    a.add(TextDelta(0, "par"))
    with pytest.raises(WorkerCrashed):
        a.add(Failed(WorkerCrashed("gone")))
