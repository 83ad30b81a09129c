"""router/generation/prompt_bound.py: texts that certainly cannot fit, refused before they
reach a worker."""

from __future__ import annotations

from typing import Any

import pytest

from router.generation.prompt_bound import bounded_text, refuse_if_too_long
from supervisor.errors import ContextOverflow
from worker.protocol import ChatMessage


# ---- texts that certainly cannot fit (issue 8, finding 3) ------------------------------------


def _ready(n_ctx_slot: int = 4096, max_token_bytes: int = 48) -> Any:
    from worker.protocol import Ready

    return Ready(
        n_ctx=n_ctx_slot, n_ctx_slot=n_ctx_slot, slots=4, n_vocab=10, n_ctx_train=n_ctx_slot,
        has_template=True, embeddings=False, n_embd=8, max_token_bytes=max_token_bytes,
    )


def test_the_bounded_text_is_the_prompt_or_the_last_user_message_stripped() -> None:
    assert bounded_text("abc", None) == "abc"
    msgs = [
        ChatMessage(role="user", content="first " * 100),
        ChatMessage(role="assistant", content="x" * 1000),
        ChatMessage(role="user", content="  last question \n"),
        ChatMessage(role="tool", content="y" * 1000),
    ]
    assert bounded_text(None, msgs) == "last question"
    assert bounded_text(None, [ChatMessage(role="system", content="z" * 10)]) == ""


def test_a_text_over_the_byte_bound_is_refused_as_context_length_exceeded() -> None:
    ready = _ready(n_ctx_slot=100, max_token_bytes=4)
    refuse_if_too_long(ready, "x" * 396, 99, "the prompt", "why", "prompt")  # 99 tokens could fit
    with pytest.raises(ContextOverflow) as info:
        refuse_if_too_long(ready, "x" * 397, 99, "the prompt", "why", "prompt")
    assert info.value.param == "prompt"
    assert info.value.message == "the prompt is at least 100 tokens (397 bytes of text); why"
    # Non-ASCII text counts its UTF-8 bytes.
    with pytest.raises(ContextOverflow):
        refuse_if_too_long(ready, "é" * 199, 99, "the prompt", "why", "prompt")


@pytest.mark.parametrize("ready", [None, "no bound"])
def test_without_a_bound_nothing_is_refused_here(ready: Any) -> None:
    r = _ready(max_token_bytes=0) if ready == "no bound" else None
    refuse_if_too_long(r, "x" * 10_000_000, 99, "the prompt", "why", "prompt")
