"""worker/media/prompt.py and worker/prompts.py: a prompt with images or audio, prepared in
the preparing threads with a fake projector (no libmtmd): what is refused before anything is
decoded, and what the request holds after (issue 42, items 2, 3 and 6)."""

from __future__ import annotations

import io
from typing import Sequence

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from tests.unit.worker.test_prompts import VocabModel
from worker.media.pictures import Pixels
from worker.media.sounds import Sound
from worker.media.spans import ImageSpan, placeholders
from worker.prompts import texts_for
from worker.protocol import MEDIA_MARKER, ChatMessage, Generate, Media, SamplingParams
from worker.rejected import RequestRejected
from worker.request import Request

PNG = io.BytesIO()
Image.new("RGB", (8, 8), "red").save(PNG, "PNG")
IMAGE = PNG.getvalue()
WAV = io.BytesIO()
sf.write(WAV, np.zeros(8000, np.float32), 8000, format="WAV", subtype="FLOAT")  # 1 s at 8 kHz
SOUND = WAV.getvalue()


class FakeProjector:
    """Text a token a byte; each marker an image of 4 positions, wrapped in tokens 7 and 8
    as gemma-3's projector wraps its images. `end_on_image`: no text after the last."""

    sample_rate = 16_000

    def __init__(self, end_on_image: bool = False, vision: bool = True, audio: bool = False) -> None:
        self.end_on_image = end_on_image
        self.vision, self.audio = vision, audio
        self.tokenized: list[str] = []
        self.items: list[Pixels | Sound] = []

    def tokenize(self, text: str, pictures: Sequence[Pixels | Sound], params: Sequence[str]) -> tuple[list[int], list[ImageSpan]]:
        self.tokenized.append(text)
        self.items += pictures
        tokens: list[int] = [2]
        spans = []
        pieces = text.split(MEDIA_MARKER)
        for i, piece in enumerate(pieces):
            tokens += list(piece.encode())
            if i < len(pictures):
                tokens.append(7)
                digest = bytes([i]) * 32
                spans.append(ImageSpan(start=len(tokens), tokens=placeholders(digest, 4), digest=digest, param=params[i]))
                tokens += spans[-1].tokens
                if not (self.end_on_image and i == len(pieces) - 2 and not pieces[-1]):
                    tokens.append(8)
        return tokens, spans


def prepare(g: Generate, projector: FakeProjector | None, n_ctx_slot: int = 4096) -> Request:
    m = VocabModel()
    r = texts_for(g, m, n_ctx_slot, 512, projector).tokenize(m)  # type: ignore[arg-type]
    assert isinstance(r, Request)
    return r


def chat(*media: Media, text: str = f"look {MEDIA_MARKER} here") -> Generate:
    g = Generate(id=1, params=SamplingParams(), messages=[ChatMessage(role="user", content=text, media=list(media))])
    return g


def with_template() -> VocabModel:
    from tests.unit.worker.test_prompts import Template

    m = VocabModel()
    m.template = Template()  # type: ignore[assignment]
    return m


def prepare_chat(g: Generate, projector: FakeProjector | None, n_ctx_slot: int = 4096) -> Request:
    m = with_template()
    r = texts_for(g, m, n_ctx_slot, 512, projector).tokenize(m)  # type: ignore[arg-type]
    assert isinstance(r, Request)
    return r


def test_a_chats_images_become_spans_of_the_request_counted_in_its_prompt() -> None:
    p = FakeProjector()
    r = prepare_chat(chat(Media(data=IMAGE, param="messages[0].content[1]")), p)
    assert p.tokenized == [f"<user>look {MEDIA_MARKER} here"]
    (span,) = r.images
    assert r.prompt[span.start : span.end] == span.tokens and span.param == "messages[0].content[1]"
    assert len(r.prompt) == 1 + len("<user>look ") + 1 + 4 + 1 + len(" here")


def test_a_model_without_a_projector_refuses_naming_the_image() -> None:
    with pytest.raises(RequestRejected) as info:
        prepare_chat(chat(Media(data=IMAGE, param="messages[0].content[1]")), None)
    assert info.value.param == "messages[0].content[1]" and "does not take images" in info.value.message


def test_a_marker_in_the_text_that_no_image_fills_is_refused_before_any_image_is_decoded() -> None:
    p = FakeProjector()
    g = chat(Media(data=b"not even decoded", param="messages[0].content[1]"), text=f"{MEDIA_MARKER} and {MEDIA_MARKER}")
    with pytest.raises(RequestRejected) as info:
        prepare_chat(g, p)
    assert info.value.param == "messages" and "2 places for images" in info.value.message
    assert p.tokenized == []


def test_a_bad_image_is_refused_naming_its_part() -> None:
    with pytest.raises(RequestRejected) as info:
        prepare_chat(chat(Media(data=b"GIF89a broken", param="messages[0].content[1]")), FakeProjector())
    assert info.value.param == "messages[0].content[1]"


def test_a_prompt_ending_on_an_image_is_refused() -> None:
    g = Generate(id=1, params=SamplingParams(), prompt=f"see {MEDIA_MARKER}", media=[Media(data=IMAGE, param="prompt.multimodal_data[0]")])
    with pytest.raises(RequestRejected) as info:
        prepare(g, FakeProjector(end_on_image=True))
    assert info.value.param == "prompt.multimodal_data[0]" and "must not end with an image" in info.value.message


def test_a_token_prompt_cannot_hold_images() -> None:
    g = Generate(id=1, params=SamplingParams(), prompt_tokens=[5, 6], media=[Media(data=IMAGE, param="prompt.multimodal_data[0]")])
    with pytest.raises(RequestRejected) as info:
        prepare(g, FakeProjector())
    assert info.value.param == "prompt.multimodal_data[0]"


def test_images_count_against_the_context() -> None:
    with pytest.raises(RequestRejected) as info:
        prepare_chat(chat(Media(data=IMAGE, param="messages[0].content[1]")), FakeProjector(), n_ctx_slot=20)
    assert info.value.code == "context_length_exceeded"


def test_a_sound_is_decoded_at_the_projectors_rate_and_stands_where_its_marker_does() -> None:
    p = FakeProjector(vision=False, audio=True)
    r = prepare_chat(chat(Media(data=SOUND, param="messages[0].content[1].input_audio.data", kind="audio")), p)
    (sound,) = p.items
    assert isinstance(sound, Sound) and sound.rate == 16_000 and len(sound.samples) == 16_000  # resampled
    (span,) = r.images
    assert span.param == "messages[0].content[1].input_audio.data"


@pytest.mark.parametrize(
    ("projector", "kind", "says"),
    [
        (None, "audio", "does not take audio"),
        (FakeProjector(), "audio", "does not take audio"),  # vision only
        (FakeProjector(vision=False, audio=True), "image", "does not take images"),
    ],
)
def test_a_kind_the_projector_has_no_encoder_for_is_refused_naming_the_part(
    projector: FakeProjector | None, kind: str, says: str
) -> None:
    data = SOUND if kind == "audio" else IMAGE
    with pytest.raises(RequestRejected) as info:
        prepare_chat(chat(Media(data=data, param="messages[0].content[1]", kind=kind)), projector)  # type: ignore[arg-type]
    assert info.value.param == "messages[0].content[1]" and says in info.value.message
    assert projector is None or projector.tokenized == []


def test_an_image_and_a_sound_in_one_prompt_each_decode_their_way() -> None:
    p = FakeProjector(audio=True)
    text = f"look {MEDIA_MARKER} and hear {MEDIA_MARKER} now"
    prepare_chat(chat(Media(data=IMAGE, param="a"), Media(data=SOUND, param="b", kind="audio"), text=text), p)
    assert [type(i) for i in p.items] == [Pixels, Sound]


def test_bad_audio_is_refused_naming_its_part() -> None:
    with pytest.raises(RequestRejected) as info:
        prepare_chat(chat(Media(data=b"RIFF....WAVE cut", param="p", kind="audio")), FakeProjector(audio=True))
    assert info.value.param == "p" and "Invalid audio at 'p'" in info.value.message
