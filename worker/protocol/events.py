"""What a generation's Step frame carries for each request that advanced: its tokens and
text, logprobs, and at its end the finish reason, usage and llama-server's timings."""

from __future__ import annotations

from typing import Literal

import msgspec

FinishReason = Literal["stop", "length", "cancelled"]
# Why a generation stopped, in llama-server's words: an end-of-generation token, the length
# limit (max_tokens or the context), or a stop string.
StopType = Literal["eos", "limit", "word"]


class Usage(msgspec.Struct, forbid_unknown_fields=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


class Timings(msgspec.Struct, forbid_unknown_fields=True):
    """llama-server's timings, as measured in the worker: prompt tokens decoded (those not
    reused from the cache) and the time they took, then tokens generated since and theirs.
    The router derives the per-token and per-second figures."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    cache_n: int = 0


class TopLogprob(msgspec.Struct, forbid_unknown_fields=True, array_like=True):
    """One candidate token: its id, its piece's bytes (the router has no vocabulary), and
    its log-probability."""

    token: int
    piece: bytes
    logprob: float


class TokenLogprob(msgspec.Struct, forbid_unknown_fields=True, array_like=True):
    """A generated token's logprob and the `top` most likely tokens at its position."""

    token: int
    piece: bytes
    logprob: float
    top: list[TopLogprob] = []


class TokenEvent(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """What one request gained in one decode step.

    `text` is complete UTF-8 with anything that might still become a stop string held back.
    A final event carries `finish_reason` and `usage`. `index` is the choice (0 .. n-1) of
    a Generate with n choices; each choice ends with its own final event. `logprobs` cover
    exactly the tokens whose text is in `text` (a held-back token's come with its text).
    """

    id: int
    text: str = ""
    tokens: list[int] = []
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    # On a final event (llama-server's /completion reports them): why it stopped, and the
    # stop string that matched, if one did.
    stop_type: StopType | None = None
    stopping_word: str = ""
    # On a final event always; on every event when params.timings_per_token.
    timings: Timings | None = None
    id_slot: int | None = None  # on a final event: the slot that ran it
    # Set on a request's first event when its rendered prompt ended inside an open
    # reasoning block (Qwen3 and DeepSeek-R1 templates end with "<think>\n"): the output
    # starts as reasoning, before any opening tag.
    in_reasoning: bool = False
    index: int = 0
    logprobs: list[TokenLogprob] = []
    echo: str | None = None  # the prompt's text, on a choice's first event when asked
    # On a choice's first event: its prompt's tokens and how many came from the prefix
    # cache (completion_tokens 0), for dialects that report them before the answer
    # (Anthropic's message_start).
    prompt_usage: Usage | None = None
