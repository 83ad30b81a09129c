"""worker/speculation.py with images: an n-gram draft never proposes an image's placeholder
ids (they would reach llama_decode as token ids), and a draft model, which has no
projector, drafts nothing for a prompt with images (issue 42, item 3)."""

from __future__ import annotations

from typing import Any

from worker.media.spans import ImageSpan
from worker.protocol import SamplingParams
from worker.request import Request
from worker.speculation import Speculation
from worker.stops import StopMatcher


def request(tokens: list[int], images: tuple[ImageSpan, ...]) -> Request:
    r = Request(id=1, params=SamplingParams(), prompt=tokens, max_new=100, stops=StopMatcher(()))
    r.images = images
    r.n_gen = 1
    return r


IMAGE = ImageSpan(start=4, tokens=[-5, -6, -7], digest=b"")
# "11 12 13 14" then the image, text; the output has just said "11 12 13 14" again.
TOKENS = [11, 12, 13, 14, -5, -6, -7, 20, 21, 22, 11, 12, 13, 14]


def test_an_ngram_draft_stops_where_an_image_begins() -> None:
    spec = Speculation(kv=None, draft_max=8, n_ctx_slot=4096)  # type: ignore[arg-type]
    assert spec.draft(request(TOKENS, (IMAGE,)), 8) == []
    # The same history without the image drafts what followed.
    text = [11, 12, 13, 14, 15, 16, 17, 20, 21, 22, 11, 12, 13, 14]
    assert spec.draft(request(text, ()), 8)[:3] == [15, 16, 17]


def test_a_draft_model_drafts_nothing_for_a_prompt_with_images() -> None:
    model: Any = object()  # never asked
    spec = Speculation(kv=None, draft_max=8, n_ctx_slot=4096, model=model)  # type: ignore[arg-type]
    assert spec._drafter(request(TOKENS, (IMAGE,))) is None
