"""Stage 2 of a prompt with images or audio (worker/prompts.py has the stages): the images'
bytes decoded into pixels (worker/media/pictures.py), the sounds' into samples at the
projector's rate (worker/media/sounds.py), and the rendered text tokenized around them by
the projector, on the preparing thread, so that none of it touches the step loop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from worker.media import pictures, sounds
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
    """Stage 1 of a prompt with images or audio (the text's byte bound, the markers
    counted), and stage 2 to come."""
    for md in media:
        audio = md.kind == "audio"
        if projector is None or not (projector.audio if audio else projector.vision):
            raise RequestRejected(
                "unsupported",
                f"this model does not take {'audio' if audio else 'images'} (its config names no projector "
                f"with {'an audio' if audio else 'a vision'} encoder: set mmproj)",
                md.param,
            )
    if projector is None:  # no media at all: never asked so
        raise RequestRejected("unsupported", "this model takes no images or audio", param)
    checked(text, limit, m)
    n_places = text.count(MEDIA_MARKER)
    if n_places != len(media):  # a template that left out a message with an image, or put one twice
        raise RequestRejected(
            "invalid_request",
            f"the rendered prompt has {n_places} places for images or audio and the request {len(media)} of them "
            "(does the chat template render every message?)",
            param,
        )

    def build(_: list[list[int]]) -> R:
        pixels, seconds = pictures.Budget(), sounds.Budget()
        items = [
            sounds.decode(md.data, md.param, projector.sample_rate, seconds) if md.kind == "audio"
            else pictures.decode(md.data, md.param, pixels)
            for md in media
        ]
        tokens, spans = projector.tokenize(text, items, [md.param for md in media])
        if len(tokens) > limit.most:
            raise limit.refuse(len(tokens))
        if spans and spans[-1].end == len(tokens):
            raise RequestRejected(
                "invalid_request", "the prompt must not end with an image or a sound: add text after it", spans[-1].param
            )
        out = request(tokens)
        if isinstance(out, Request):
            out.images = tuple(spans)
        return out

    return Texts([], build)
