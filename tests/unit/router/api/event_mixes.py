"""Internal event streams for the renderers' tests: a helper to play a list of events, and
a hypothesis strategy for any mix of reasoning, text (whitespace alone included) and tool
calls, which a dialect's whole answer and its stream must agree on."""

from __future__ import annotations

import json
from typing import AsyncIterator

from hypothesis import strategies as st

from router.generation.events import Event, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart


async def play(events: list[Event]) -> AsyncIterator[Event]:
    for ev in events:
        yield ev


def call(i: int, name: str, args: str) -> list[Event]:
    """Call `i` of choice 0, its arguments in two deltas."""
    return [ToolCallStart(0, i, f"call_{i}", name), ToolCallDelta(0, i, args[:3]), ToolCallDelta(0, i, args[3:]), ToolCallEnd(0, i)]


def _deltas(parts: list[tuple[str, str]]) -> tuple[list[Event], int]:
    events: list[Event] = []
    n_calls = 0
    for kind, value in parts:
        if kind == "r":
            events.append(ReasoningDelta(0, value))
        elif kind == "t":
            events.append(TextDelta(0, value))
        else:
            events += call(n_calls, value, json.dumps({"n": n_calls}))
            n_calls += 1
    return events, n_calls


_PART = st.one_of(
    st.builds(lambda t: ("r", t), st.text(min_size=1, max_size=6)),
    st.builds(lambda t: ("t", t), st.sampled_from(["\n", " ", "a", "b c", "\n\n", "é"])),
    st.builds(lambda n: ("c", n), st.sampled_from(["f", "g"])),
)
# A choice's deltas, and how many calls they make.
MIXES = st.lists(_PART, max_size=12).map(_deltas)
