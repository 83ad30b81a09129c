"""Where a sequence's tokens sit: the position llama.cpp is given for each of a slot's books.

For almost every model the token at index k of a sequence sits at position k. M-RoPE models
(the Qwen2-VL family: llama.cpp's rope types MROPE and IMROPE) place an image on a grid: all
of its n tokens share the image's first position in the KV cells (they differ by a 2-D
position llama.cpp keeps beside), and the text after it goes on `n_pos` later, where n_pos
(libmtmd's `mtmd_input_chunk_get_n_pos`, the grid's longer side) is far less than n. Facts
measured with this llama.cpp (12 image tokens on a 4 x 3 grid after 6 text tokens: cells at
6, next text at 10; text at 7 is accepted and silently wrong):

- a text batch must start at the position computed here, which llama.cpp does not check;
- `llama_memory_seq_rm(seq, p, -1)` and `seq_cp(.., 0, p)` take positions: an index past
  an image removes nothing, or copies what follows it;
- a sequence's highest position after an image is the image's first one.

The books are plain token lists, and a slot's image placeholders (worker/media/spans.py)
are the only record of an image in them. So an M-RoPE image's placeholders carry their
positions in their lowest bit: the first n_pos are odd (each moves the next position on by
one), the rest even. Everything here is a function of the token list alone: a prompt kept
in a cache entry, in host memory or on disk needs no other record. For other models every
function is the identity on indices (and their placeholders' bits are random).

Pure; the KV cache (worker/kv_cache.py) asks.
"""

from __future__ import annotations

from typing import Sequence

from worker.media.spans import is_placeholder


def stays(token: int) -> bool:
    """An M-RoPE image position that does not move the next position on."""
    return is_placeholder(token) and token % 2 == 0


def position(tokens: Sequence[int], k: int, mrope: bool) -> int:
    """The position of the token at index `k` (at most len(tokens)), or of the next one
    decoded after the first `k`. `k` is a boundary: the start of a text token or image."""
    if not mrope:
        return k
    return k - sum(1 for t in tokens[:k] if t < 0 and stays(t))


def last_position(tokens: Sequence[int], mrope: bool) -> int:
    """The highest position the cells of a sequence holding `tokens` hold; -1 for none. After
    an M-RoPE image, its first position (every one of its cells is there)."""
    n = len(tokens)
    if not mrope or n == 0 or not is_placeholder(tokens[-1]):
        return position(tokens, n, mrope) - 1
    return position(tokens, run_start(tokens, n), mrope)


def run_start(tokens: Sequence[int], k: int) -> int:
    """Where the run of placeholders that index `k` ends or stands inside begins: `k` when
    the token before it is text. Two images never touch (libmtmd puts the model's own
    delimiter tokens around each), so a run is one image."""
    while k > 0 and is_placeholder(tokens[k - 1]):
        k -= 1
    return k


def whole(tokens: Sequence[int], k: int) -> int:
    """`k`, moved back to the start of the image it would cut in two: an M-RoPE image's
    cells share one position, so no cut can keep part of one."""
    if 0 < k < len(tokens) and is_placeholder(tokens[k]) and is_placeholder(tokens[k - 1]):
        return run_start(tokens, k)
    return k
