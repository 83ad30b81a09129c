"""A whole (not streamed) answer, gathered from the internal event stream: what each
choice said, in every part, and how it ended. Dialects shape it (router/api/*/).

Pure: events in, plain values out, so it is tested without a worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from router.generation.events import (
    Done, Event, Failed, Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart,
)
from router.server import json_text
from worker.protocol import Timings, TokenLogprob, Usage


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""


@dataclass
class ChoiceAnswer:
    index: int
    echo: str = ""  # the prompt's text, when a completion asked for it
    parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: Finish | None = None

    @property
    def content(self) -> str:
        """The answer's text, without the echoed prompt."""
        return "".join(self.parts)

    @property
    def text(self) -> str:
        """The echoed prompt and the answer."""
        return self.echo + self.content

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_parts)


@dataclass
class Answer:
    """Every choice of an answer, by index; `usage` is the whole answer's."""

    by_index: dict[int, ChoiceAnswer] = field(default_factory=dict)
    usage: Usage | None = None
    timings: Timings | None = None  # of the last choice to finish: one choice's are the answer's

    def add(self, ev: Event) -> None:
        """Take one event; a `Failed` raises its error, as a whole answer has no way to
        end cut."""
        if isinstance(ev, Failed):
            raise ev.error
        if isinstance(ev, Done):
            self.usage = ev.usage
            return
        c = self.by_index.setdefault(ev.choice, ChoiceAnswer(ev.choice))
        if isinstance(ev, TextDelta):
            c.echo = c.echo or ev.echo
            c.parts.append(ev.text)
            c.tokens.extend(ev.tokens)
            c.logprobs.extend(ev.logprobs)
        elif isinstance(ev, ReasoningDelta):
            c.reasoning_parts.append(ev.text)
            c.logprobs.extend(ev.logprobs)
        elif isinstance(ev, ToolCallStart):
            c.calls.append(Call(ev.id, ev.name))
            c.logprobs.extend(ev.logprobs)
        elif isinstance(ev, ToolCallDelta):
            c.calls[ev.call].arguments += ev.arguments
        elif isinstance(ev, Finish):
            c.finish = ev
            self.timings = ev.timings or self.timings

    def ordered(self) -> list[ChoiceAnswer]:
        return [self.by_index[i] for i in sorted(self.by_index)]


async def gather(events: AsyncIterator[Event]) -> Answer:
    answer = Answer()
    async for ev in events:
        answer.add(ev)
    return answer


def arguments(text: str) -> dict[str, Any]:
    """A call's arguments as an object, for dialects that send one (Ollama's, Anthropic's
    `input`; their clients refuse a string). A model that wrote other JSON keeps it, under
    "arguments", rather than losing it."""
    try:
        value = json_text.loads(text)
    except ValueError:
        value = text
    return value if isinstance(value, dict) else {"arguments": value}
