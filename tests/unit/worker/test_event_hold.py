"""worker/event_hold.py: a non-streaming request's events after each choice's first are
sent with its final one, in order; nothing else is delayed, and nothing is left behind."""

from __future__ import annotations

from worker.event_hold import EventHold
from worker.protocol import Error, Frame, Occupancy, Step, TokenEvent


def ev(rid: int, text: str, index: int = 0, final: bool = False) -> TokenEvent:
    return TokenEvent(id=rid, text=text, index=index, finish_reason="stop" if final else None)


class Sink:
    def __init__(self) -> None:
        self.frames: list[Frame] = []

    def __call__(self, frame: Frame) -> None:
        self.frames.append(frame)

    def texts(self) -> list[list[str]]:
        return [[e.text for e in f.events] for f in self.frames if isinstance(f, Step)]


def test_a_held_request_sends_its_first_event_at_once_and_the_rest_with_its_last() -> None:
    sink = Sink()
    hold = EventHold(sink)
    hold.hold(1, 1)
    for text in ("a", "b", "c"):
        hold(Step(events=[ev(1, text)]))
    assert sink.texts() == [["a"]]
    hold(Step(events=[ev(1, "d", final=True)]))
    assert sink.texts() == [["a"], ["b", "c", "d"]]
    assert hold.holding == 0


def test_requests_not_held_pass_step_by_step_beside_a_held_one() -> None:
    sink = Sink()
    hold = EventHold(sink)
    hold.hold(1, 1)
    hold(Step(events=[ev(1, "a"), ev(2, "x")]))
    hold(Step(events=[ev(1, "b"), ev(2, "y")]))
    hold(Step(events=[ev(1, "c")]))  # nothing to send: no frame at all
    hold(Step(events=[ev(1, "d", final=True), ev(2, "z", final=True)]))
    assert sink.texts() == [["a", "x"], ["y"], ["b", "c", "d", "z"]]


def test_each_choice_is_released_by_its_own_final_event() -> None:
    sink = Sink()
    hold = EventHold(sink)
    hold.hold(7, 2)
    hold(Step(events=[ev(7, "a0", 0), ev(7, "a1", 1)]))
    hold(Step(events=[ev(7, "b0", 0), ev(7, "b1", 1)]))
    hold(Step(events=[ev(7, "c1", 1, final=True)]))
    assert hold.holding == 1  # choice 0 goes on
    hold(Step(events=[ev(7, "c0", 0, final=True)]))
    assert sink.texts() == [["a0", "a1"], ["b1", "c1"], ["b0", "c0"]]
    assert hold.holding == 0


def test_an_error_or_a_cancel_drops_what_was_held_and_other_frames_pass() -> None:
    sink = Sink()
    hold = EventHold(sink)
    hold.hold(1, 1)
    hold.hold(2, 1)
    for rid in (1, 2):
        hold(Step(events=[ev(rid, "first")]))
        hold(Step(events=[ev(rid, "held")]))
    hold(Error(id=1, code="internal", message="boom"))
    hold.drop(2)
    hold(Occupancy(active=0, queued=0))
    assert hold.holding == 0
    assert [type(f).__name__ for f in sink.frames] == ["Step", "Step", "Error", "Occupancy"]
    # A late final event of a dropped request goes out alone, as any other event does.
    hold(Step(events=[ev(2, "end", final=True)]))
    assert sink.texts()[-1] == ["end"]


def test_a_request_whose_first_event_is_final_is_not_left_behind() -> None:
    sink = Sink()
    hold = EventHold(sink)
    hold.hold(3, 1)
    hold(Step(events=[ev(3, "only", final=True)]))
    assert sink.texts() == [["only"]]
    assert hold.holding == 0
