"""Stage 2 of a prompt with images (worker/prompts.py has the stages): the images' bytes
decoded into pixels (worker/media/pictures.py) and the rendered text tokenized around them
by the projector, on the preparing thread, so that neither touches the step loop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from worker.media.pictures import Budget, decode
from worker.protocol import MEDIA_MARKER, Media, TokenizeResult
from worker.rejected import RequestRejected
from worker.request import Request
from worker.text_limits import Limit, Texts, TextModel, checked

if TYPE_CHECKING:
    from worker.media.projector import Projector


R = TypeVar("R", Request, TokenizeResult)


def media_texts(
    media: Sequence[Media], m: TextModel, projector: Projector | None, text: str, limit: Limit, param: str,
    request: Callable[[list[int]], R],
) -> Texts:
    """Stage 1 of a prompt with images (the text's byte bound, the markers counted), and
    stage 2 to come."""
    if projector is None or not projector.vision:
        raise RequestRejected(
            "unsupported",
            "this model does not take images (its config names no projector: set mmproj)",
            media[0].param if media else param,
        )
    checked(text, limit, m)
    n_places = text.count(MEDIA_MARKER)
    if n_places != len(media):  # a template that left out a message with an image, or put one twice
        raise RequestRejected(
            "invalid_request",
            f"the rendered prompt has {n_places} places for images and the request {len(media)} images "
            "(does the chat template render every message?)",
            param,
        )

    def build(_: list[list[int]]) -> R:
        budget = Budget()
        pictures = [decode(md.data, md.param, budget) for md in media]
        tokens, spans = projector.tokenize(text, pictures, [md.param for md in media])
        if len(tokens) > limit.most:
            raise limit.refuse(len(tokens))
        if spans and spans[-1].end == len(tokens):
            raise RequestRejected("invalid_request", "the prompt must not end with an image: add text after it", spans[-1].param)
        out = request(tokens)
        if isinstance(out, Request):
            out.images = tuple(spans)
        return out

    return Texts([], build)
