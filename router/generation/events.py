"""The internal event stream: what a generation produces, in no dialect's shape.

Every dialect renders these (router/api/*/): OpenAI's chunks, llama-server's events,
Ollama's NDJSON lines. router/generation/stream.py makes them from the worker's TokenEvents,
splitting reasoning off and parsing tool calls on the way, so that no dialect parses model
output itself and all of them agree on what a reply said.

Per choice (`choice`: 0 .. prompts * n - 1, prompt p's j-th choice being p * n + j) the order
is: `Begin`, then deltas (`TextDelta`, `ReasoningDelta`, `ToolCallStart`,
`ToolCallDelta`, `ToolCallEnd`) in the order the model wrote them, then one `Finish`.
Choices interleave. The stream ends with one `Done` (every choice finished), or with one
`Failed` when the generation broke after it began; nothing follows either.

`logprobs` on a delta cover the tokens whose text the delta carries (the first delta made
from a step carries the step's; a step whose text is all held back gives a `TextDelta` with
empty text and its logprobs). `timings` ride on deltas only when the request asked for them
per token (llama-server's timings_per_token); `Finish` always carries the choice's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from supervisor.errors import CorralError
from worker.protocol import StopType, Timings, TokenLogprob, Usage

# Why a choice ended. The worker's reasons, and "tool_calls": the reply made calls (also
# when max_tokens cut a later one short, or the calls ended in a repeat).
Reason = Literal["stop", "length", "cancelled", "tool_calls"]


@dataclass(frozen=True, slots=True)
class Begin:
    """A choice's output begins (before its first token, for the first prompt's choices).
    `usage`: the first prompt's tokens and cached tokens (completion_tokens 0), where the
    worker told them, for a dialect that reports them up front (Anthropic's message_start)."""

    choice: int
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Answer text. `tokens` are the ids it came from (empty in a chat, whose text has been
    through the parsers); `echo` is the prompt's text, before `text`, on a choice's first
    delta when a completion asked for it; `last`: this text came with the choice's last
    step, and its Finish follows at once."""

    choice: int
    text: str
    tokens: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    timings: Timings | None = None
    echo: str = ""
    last: bool = False


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Text of the model's reasoning (a <think> block, split off the answer)."""

    choice: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    timings: Timings | None = None


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins: `call` numbers it within its choice (0, 1, ...)."""

    choice: int
    call: int
    id: str
    name: str
    logprobs: tuple[TokenLogprob, ...] = ()
    timings: Timings | None = None


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """More of a call's arguments, as JSON text (all of them, as Corral parses whole calls)."""

    choice: int
    call: int
    arguments: str
    timings: Timings | None = None


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    choice: int
    call: int


@dataclass(frozen=True, slots=True)
class Finish:
    """A choice ended. `usage` is its own (its prompt's tokens, counted once per prompt
    in `Done`); `stop_type` and `stopping_word` say which stop ended it, as llama-server
    reports them; `id_slot` is the worker slot that ran it."""

    choice: int
    reason: Reason
    usage: Usage
    timings: Timings | None = None
    stop_type: StopType | None = None
    stopping_word: str = ""
    id_slot: int | None = None


@dataclass(frozen=True, slots=True)
class Done:
    """Every choice finished: the usage of the whole response (each prompt counted once)."""

    usage: Usage


@dataclass(frozen=True, slots=True)
class Failed:
    """The generation broke after it began (the worker crashed, for one): the answer so
    far is not whole, and a dialect must say so rather than end normally."""

    error: CorralError


Delta = Union[TextDelta, ReasoningDelta, ToolCallStart, ToolCallDelta, ToolCallEnd]
Event = Union[Begin, TextDelta, ReasoningDelta, ToolCallStart, ToolCallDelta, ToolCallEnd, Finish, Done, Failed]
