"""Token logprobs in OpenAI's two shapes: chat's `logprobs.content` and the legacy
completions' parallel lists.

The worker sends each token's piece as bytes (the router has no vocabulary); a token's
`token` string is those bytes as UTF-8, with a replacement character where a piece holds
part of a character (its `bytes` stay exact, so joining them spells the content).
"""

from __future__ import annotations

from typing import Iterable

from worker.protocol import TokenLogprob


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
