"""worker/media/steps.py: when the engine may sleep for an encode. Only once every running
request's image has been asked of the encoder: one not asked for yet is asked by the next
step, and sleeping first cost each image of a request the loop's half-second wait (32 small
images took 19 s, now 3 s)."""

from __future__ import annotations

from worker.media.spans import ImageSpan
from worker.media.steps import ImageSteps
from worker.protocol import SamplingParams
from worker.request import Request
from worker.slots import Slot
from worker.stops import StopMatcher


def running(span: ImageSpan, cached: int) -> Slot[Request]:
    req = Request(id=1, params=SamplingParams(), prompt=[1] * span.start + span.tokens + [2], max_new=4, stops=StopMatcher(()))
    req.images = (span,)
    slot: Slot[Request] = Slot(seq_id=0, id=0)
    slot.cache.extend(req.tokens[:cached])
    slot.request, req.slot = req, slot
    return slot


def stalled(*slots: Slot[Request]) -> bool:
    return ImageSteps.stalled(None, slots)  # type: ignore[arg-type]  # reads no state of its own


def test_the_engine_sleeps_only_on_encodes_it_has_asked_for() -> None:
    span = ImageSpan(start=3, tokens=[-5, -6], digest=b"")
    slot = running(span, cached=3)
    assert not stalled(slot)  # at the image, not asked for yet: the next step asks
    span.busy = True
    assert stalled(slot)  # asked, not done: nothing to step until the Wake
    span.embd = object()
    assert stalled(slot)  # still its thread's until it says so
    span.busy = False
    assert not stalled(slot)  # ready: the next step decodes it
    other = running(ImageSpan(start=1, tokens=[-7], digest=b"", busy=True), cached=0)
    assert not stalled(running(ImageSpan(start=3, tokens=[-5], digest=b"", busy=True), cached=3), other)  # text to decode
