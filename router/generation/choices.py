"""A response's choices as their events arrive: text, logprobs in OpenAI's two shapes,
and the usage of n choices over one or more prompts.

Pure: TokenEvents in, JSON-ready dicts out, so the shapes are tested without a worker.
The worker sends each token's piece as bytes (the router has no vocabulary); a token's
`token` string is those bytes as UTF-8, with a replacement character where a piece holds
part of a character (its `bytes` stay exact, so joining them spells the content).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from worker.protocol import TokenEvent, TokenLogprob, Usage


def token_text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def chat_logprobs(lps: Iterable[TokenLogprob]) -> dict[str, object]:
    """Chat's `choice.logprobs`: {"content": [...], "refusal": null}."""
    content = [
        {
            "token": token_text(lp.piece),
            "logprob": lp.logprob,
            "bytes": list(lp.piece),
            "top_logprobs": [
                {"token": token_text(t.piece), "logprob": t.logprob, "bytes": list(t.piece)} for t in lp.top
            ],
        }
        for lp in lps
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(lps: Iterable[TokenLogprob], offset: int) -> tuple[dict[str, object], int]:
    """The legacy completions shape, {tokens, token_logprobs, top_logprobs, text_offset},
    with offsets counted from `offset` (the characters of the choice before these tokens);
    returns it and the offset after them."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top: list[dict[str, float]] = []
    text_offset: list[int] = []
    for lp in lps:
        text = token_text(lp.piece)
        tokens.append(text)
        token_logprobs.append(lp.logprob)
        top.append({token_text(t.piece): t.logprob for t in lp.top})
        text_offset.append(offset)
        offset += len(text)
    shape: dict[str, object] = {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": text_offset,
    }
    return shape, offset


def merged_usage(finals: dict[int, Usage], n: int) -> Usage:
    """The usage of a response whose choice `i` ended with `finals[i]`: choices
    p*n .. p*n+n-1 share prompt p, which counts once (its cached tokens as choice p*n,
    the one that evaluated it, saw them); completion tokens add up over every choice."""
    prompt = cached = completion = 0
    for i, u in finals.items():
        completion += u.completion_tokens
        if i % n == 0:
            prompt += u.prompt_tokens
            cached += u.cached_tokens
    return Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


@dataclass
class Choice:
    """One choice of a whole (not streamed) response, built from its events."""

    index: int
    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    echo: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    # A chat choice's message as router/generation/chat_output.py parsed it (reasoning, tool calls);
    # None: the plain content of `text`.
    message: dict[str, object] | None = None
    in_reasoning: bool = False  # its output began inside a reasoning block

    def add(self, ev: TokenEvent) -> None:
        self.in_reasoning = self.in_reasoning or ev.in_reasoning
        if ev.echo is not None:
            self.echo = ev.echo
        self.parts.append(ev.text)
        self.logprobs.extend(ev.logprobs)
        if ev.finish_reason is not None:
            self.finish_reason, self.usage = ev.finish_reason, ev.usage

    @property
    def text(self) -> str:
        return self.echo + "".join(self.parts)


class Choices:
    """Every choice of a whole response, by index."""

    def __init__(self) -> None:
        self.by_index: dict[int, Choice] = {}

    def add(self, ev: TokenEvent) -> None:
        self.by_index.setdefault(ev.index, Choice(ev.index)).add(ev)

    def ordered(self) -> list[Choice]:
        return [self.by_index[i] for i in sorted(self.by_index)]

    def usage(self, n: int) -> Usage:
        return merged_usage({c.index: c.usage for c in self.by_index.values() if c.usage is not None}, n)
