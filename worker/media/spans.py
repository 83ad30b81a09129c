"""How an image, or a 30 s window of a sound, stands in a request's tokens: a span of
placeholder ids. (Audio windows are spans as images are; "image" below means either.)

Every cache rule in the worker (slot choice, prefix reuse, parked entries, the host-memory
prompt store, slot files, n-gram drafts) compares token lists. An image's positions are
given ids that are a function of its pixels (and of the projector that encodes them), so
each of those rules treats an image as the tokens of that exact image and nothing else:

- placeholders are negative (below -1), and every text token is >= 0, so no text ever matches an
  image, and no placeholder can reach llama.cpp as a token (the engine decodes a span's
  embeddings; drafts stop at the first negative id);
- each position's id is drawn from the image's digest and its index (SHAKE-256), 31 bits
  each: two different images share a prefix of their spans only by a collision of 31 bits
  at every position, and they differ at the first one;
- the digest covers the projector's identity, so a prompt saved by a worker with another
  projector (the prompt store on disk) is never taken for this one's.

Pure: no ctypes. The projector (worker/media/projector.py) makes the spans; the engine's
image step (worker/media/steps.py) decodes them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Sequence


# The ids an image's positions take: -2**31 .. -2. Not -1, which is LLAMA_TOKEN_NULL, the
# mark of llama-server's packed token list in a slot file (worker/slot_file_format.py).
LOWEST, HIGHEST = -(2**31), -2


def placeholders(digest: bytes, n: int, n_pos: int | None = None) -> list[int]:
    """The `n` ids that stand for the image of `digest`. An M-RoPE model's image (`n_pos`
    given), whose `n` tokens take only `n_pos` positions, says so in their lowest bits: the
    first n_pos odd, the rest even (worker/kv_positions.py reads them)."""
    raw = hashlib.shake_256(digest).digest(4 * n)
    span = HIGHEST - LOWEST + 1
    ids = [HIGHEST - int.from_bytes(raw[4 * i : 4 * i + 4], "little") % span for i in range(n)]
    if n_pos is None:  # not M-RoPE: a position a token, whatever the bits
        return ids
    # Odd: -2 (the highest) goes down to -3, never up to -1. Even: down by one, which odd
    # ids, all above the lowest (even) one, can go.
    return [(t if t % 2 else t + 1 if t < HIGHEST else t - 1) if i < n_pos else t - t % 2 for i, t in enumerate(ids)]


def is_placeholder(token: int) -> bool:
    return LOWEST <= token <= HIGHEST


@dataclass(eq=False)
class ImageSpan:
    """One image (or audio window) of a request: its positions start .. start + n - 1 in the
    request's tokens.

    `chunk` is the projector's handle (an owned libmtmd chunk); `embd` its embeddings once
    encoded (set by the encoder thread, read by the engine's); `failed` why it could not be;
    `cells` the request's sequence up to and with the image, once decoded beside the engine
    (worker/media/beside.py), until the engine puts them in place.
    """

    start: int
    tokens: list[int]
    digest: bytes
    # The position of its first token: `start`, less what M-RoPE images before it saved
    # (worker/kv_positions.py).
    pos: int = -1
    chunk: Any = None
    embd: Any = None  # numpy float32, n x n_embd, once encoded
    failed: str | None = None
    # Handed to the encoder thread (worker/media/encoder.py) and not back: set by the
    # engine thread, cleared by the encoder's after its results.
    busy: bool = False
    cells: bytes | None = None
    tail: list[int] = field(default_factory=list)  # the text after it that `cells` hold too
    in_place: bool = False  # decode it in the engine's context, not beside (that failed once)
    param: str = ""
    scope: str = ""  # the cache scope it was encoded for (worker/media/encoder.py)

    def __post_init__(self) -> None:
        if self.pos < 0:
            self.pos = self.start

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def text_ahead(spans: Sequence[ImageSpan], n_cached: int, n_tokens: int) -> int:
    """How many tokens after the first `n_cached` may go into a batch as text: up to the next
    image (0 when the next position is an image's, or inside one)."""
    for s in spans:
        if s.end > n_cached:
            return max(0, s.start - n_cached)
    return n_tokens - n_cached


def text_after(spans: Sequence[ImageSpan], span: ImageSpan, n_tokens: int) -> int:
    """Where the text after `span` ends: at the next image, or at the last of `n_tokens`
    (left for the engine to decode, for its logits)."""
    return min([s.start for s in spans if s.start >= span.end] + [max(n_tokens - 1, span.end)])


def image_at(spans: Sequence[ImageSpan], n_cached: int) -> ImageSpan | None:
    """The image whose positions the next decode of a sequence holding `n_cached` tokens
    reaches, if any: one that starts there, or one the cache ends inside of."""
    for s in spans:
        if s.start <= n_cached < s.end:
            return s
    return None
