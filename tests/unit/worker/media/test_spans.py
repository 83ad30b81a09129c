"""worker/media/spans.py: an image as the tokens of that exact image (issue 42, item 3)."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from worker.media.spans import ImageSpan, image_at, placeholders, text_ahead


def digest(n: int) -> bytes:
    return hashlib.sha256(str(n).encode()).digest()


@given(a=st.integers(), b=st.integers(), n=st.integers(1, 300))
def test_placeholders_are_negative_int32s_of_their_image_alone(a: int, b: int, n: int) -> None:
    ids = placeholders(digest(a), n)
    assert len(ids) == n and all(-(2**31) <= t <= -2 for t in ids)  # -1 is LLAMA_TOKEN_NULL
    assert placeholders(digest(a), n) == ids  # a function of the image
    if a != b:
        assert placeholders(digest(b), n)[0] != ids[0]  # two images part at their first position


def test_the_next_text_stops_at_each_image_and_the_image_is_found_from_inside() -> None:
    spans = (ImageSpan(start=5, tokens=[-1] * 4, digest=b""), ImageSpan(start=12, tokens=[-2] * 3, digest=b""))
    # tokens: text 0..4, image 5..8, text 9..11, image 12..14, text 15..19
    assert text_ahead(spans, 0, 20) == 5
    assert text_ahead(spans, 5, 20) == 0 and image_at(spans, 5) is spans[0]
    assert text_ahead(spans, 7, 20) == 0 and image_at(spans, 7) is spans[0]  # inside: cut back
    assert text_ahead(spans, 9, 20) == 3 and image_at(spans, 9) is None
    assert text_ahead(spans, 15, 20) == 5 and image_at(spans, 15) is None
    assert text_ahead((), 3, 20) == 17
