"""worker/kv_positions.py: each token's position, from a slot's books alone. An M-RoPE image
of n tokens takes n_pos positions, which its placeholders carry in their lowest bits
(worker/media/spans.py); positions llama.cpp was measured to give: 6 text tokens, a 4 x 3
image (12 tokens, 4 positions) whose cells all sit at 6, the next text at 10."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from worker.kv_positions import last_position, position, whole
from worker.media.spans import is_placeholder, placeholders


def image(seed: int, n: int, n_pos: int | None) -> list[int]:
    return placeholders(hashlib.sha256(str(seed).encode()).digest(), n, n_pos)


def test_the_measured_example() -> None:
    books = [1, 2, 3, 4, 5, 6, *image(0, 12, 4), 7, 8]
    assert position(books, 6, True) == 6  # the image's first position
    assert position(books, 18, True) == 10  # the text after it: 6 + n_pos
    assert position(books, 20, True) == 12
    assert last_position(books, True) == 11
    assert last_position(books[:18], True) == 6  # ending in the image: its cells are all at 6
    assert last_position(books[:6], True) == 5
    # Without M-RoPE a position is its index, whatever the ids.
    assert position(books, 18, False) == 18 and last_position(books, False) == 19


def test_a_cut_inside_an_image_goes_back_to_its_start() -> None:
    books = [1, 2, *image(1, 12, 4), 3]
    assert whole(books, 5) == 2 and whole(books, 2) == 2 and whole(books, 14) == 14 and whole(books, 15) == 15


@given(seed=st.integers(), n=st.integers(1, 400), data=st.data())
def test_an_m_rope_image_carries_exactly_its_positions(seed: int, n: int, data: st.DataObject) -> None:
    n_pos = data.draw(st.integers(1, n))
    ids = image(seed, n, n_pos)
    assert all(is_placeholder(t) for t in ids)  # never -1 (LLAMA_TOKEN_NULL), never text
    books = [10, *ids, 11]
    assert position(books, 1 + n, True) == 1 + n_pos
    assert last_position(books[: 1 + n], True) == 1
    # Another model's image: the same digest's ids, in every bit but the lowest.
    assert [t // 2 for t in image(seed, n, None)] == [t // 2 for t in ids] or -3 in ids
