"""Texts that certainly cannot fit a model's context, refused before they reach its worker."""

from __future__ import annotations

from supervisor.errors import ContextOverflow
from worker.protocol import ChatMessage, Ready, fewest_tokens, utf8_length


def bounded_text(prompt: str | None, messages: list[ChatMessage] | None) -> str:
    """The text a prompt certainly contains, whatever its chat template: a completion's
    prompt, or a chat's last user message without surrounding whitespace. Templates may
    trim content, drop roles they do not know, or strip old reasoning, but every one writes
    the question it is asked to answer."""
    if messages is None:
        return prompt or ""
    return next((m.content for m in reversed(messages) if m.role == "user"), "").strip()


def refuse_if_too_long(ready: Ready | None, text: str, most: int, what: str, why: str, param: str) -> None:
    """ContextOverflow when `text` alone certainly makes more than `most` tokens.

    This spares the worker a text it would refuse anyway: a 15 MB prompt is refused here
    in the time it takes to read it, instead of crossing to the worker to be rendered and
    measured there. It errs in one direction only; the worker checks the whole rendered
    prompt exactly.
    """
    if ready is None or not ready.max_token_bytes or len(text) <= most:
        return  # each token covers at least one byte: a short text needs no bound
    n_bytes = utf8_length(text)
    at_least = fewest_tokens(n_bytes, ready.max_token_bytes)
    if at_least > most:
        raise ContextOverflow(
            f"{what} is at least {at_least} tokens ({n_bytes} bytes of text); {why}", param,
            n_prompt_tokens=at_least, n_ctx=ready.n_ctx_slot,
        )
