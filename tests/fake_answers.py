"""The answers both test workers give to llama-server's requests (Detokenize, Render,
SlotsQuery, tokenize pieces, mixed prompts), so that sim and process tests of the native
routes run without a model.

The fake vocabulary: a word is one token (crc32 of the word mod N_VOCAB), BOS is id 1, and
an id's text is "<id>". Imports only the standard library and worker.protocol: the process
fake must start in a fraction of a second.
"""

from __future__ import annotations

import zlib

from worker.protocol import (
    ChatMessage,
    DetokenizeResult,
    Error,
    Generate,
    Rendered,
    SlotState,
    Timings,
    TokenizeResult,
)

N_VOCAB = 32000
BOS = 1


def tokenize(text: str, add_special: bool = True) -> list[int]:
    ids = [zlib.crc32(w.encode()) % N_VOCAB for w in text.split()]
    return ([BOS] if add_special else []) + ids


def tokenize_result(rid: int, text: str, add_special: bool, with_pieces: bool) -> TokenizeResult:
    """Each word's piece is the word; BOS's is "<bos>"."""
    tokens = tokenize(text, add_special)
    if not with_pieces:
        return TokenizeResult(id=rid, tokens=tokens)
    pieces: list[str | list[int]] = (["<bos>"] if add_special else []) + list(text.split())
    return TokenizeResult(id=rid, tokens=tokens, pieces=pieces)


def bad_id(rid: int, ids: list[int | str], param: str) -> Error | None:
    """The worker's refusal of an id outside the vocabulary, as the real one words it."""
    for i, t in enumerate(ids):
        if isinstance(t, int) and not 0 <= t < N_VOCAB:
            return Error(
                id=rid, code="invalid_request", param=param,
                message=f"Invalid token id {t} at {param}[{i}]: this model's vocabulary has ids 0 to {N_VOCAB - 1}.",
            )
    return None


def detokenize(rid: int, ids: list[int]) -> DetokenizeResult | Error:
    err = bad_id(rid, list(ids), "tokens")
    return err or DetokenizeResult(id=rid, content="".join(f"<{t}>" for t in ids))


def render(rid: int, messages: list[ChatMessage]) -> Rendered:
    """A stand-in template: each turn as <role>content, then the generation prompt."""
    return Rendered(id=rid, prompt="".join(f"<{m.role}>{m.content}\n" for m in messages) + "<assistant>")


def prompt_tokens(g: Generate) -> int:
    """How many tokens a Generate's prompt makes in the fake vocabulary."""
    if g.prompt_parts is not None:
        n = 0
        for i, p in enumerate(g.prompt_parts):
            n += 1 if isinstance(p, int) else len(tokenize(p, add_special=i == 0))
        return n
    if g.prompt_tokens is not None:
        return len(g.prompt_tokens)
    if g.messages is not None:
        return len(tokenize("\n".join(m.content for m in g.messages)))
    return len(tokenize(g.prompt or ""))


def prompt_text(g: Generate) -> str:
    """A Generate's prompt as text (what `echo` gives back in the fakes)."""
    if g.prompt_tokens is not None:
        return " ".join(map(str, g.prompt_tokens))
    if g.messages is not None:
        return "\n".join(m.content for m in g.messages)
    return g.prompt or ""


def idle_slots(n: int, n_ctx: int) -> list[SlotState]:
    return [SlotState(id=i, n_ctx=n_ctx, is_processing=False) for i in range(n)]


def timings(prompt_n: int, predicted_n: int, step_s: float) -> Timings:
    """Timings as if the prompt took one step and each token one more."""
    return Timings(prompt_n=prompt_n, prompt_ms=step_s * 1000.0, predicted_n=predicted_n,
                   predicted_ms=predicted_n * step_s * 1000.0)
