"""A lone stream's steps run back to back (worker/run_ahead.py), on the real demo model.

Running ahead must not change an answer: it decodes the same one-token batches (and drafts)
at the same positions as the engine's full step, so the tokens must be identical, not only
close. Each comparison is against a second engine whose run-ahead is off (`limit` 0), fed
the same requests in the same order. It must also give the loop back at once when anything
else arrives, and keep the KV invariant check before each of its decodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import DEMO_MODEL
from tests.e2e.engine_driver import EngineDriver
from worker.protocol import WorkerSpec
from worker.run_ahead import LIMIT
from worker.slots import Slot

SPEC = WorkerSpec(name="demo", path=str(DEMO_MODEL), slots=2, n_ctx=1024)
STORY = "Write a long story about a lighthouse keeper and the sea."
# A prompt that repeats itself: n-gram drafts are found and verified while running ahead.
LIST = "Count: " + ", ".join(str(i) for i in range(1, 40))


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[EngineDriver, EngineDriver]]:
    """The same engine twice: running ahead, and always taking the full step."""
    ahead, full = EngineDriver(SPEC), EngineDriver(SPEC)
    full.engine.ahead.limit = 0
    yield ahead, full


def answer(
    d: EngineDriver, text: str, max_tokens: int, stop: list[str] | None = None, hold: bool = False
) -> tuple[list[int], str, int]:
    """Tokens, finish reason and Step frames of one greedy request, alone on `d`."""
    rid, o = d.generate(d.model.tokenize(text), max_tokens, hold=hold, stop=stop)
    assert o.done.wait(120) and o.error is None, o.error
    d.wait_idle()
    return o.tokens[0], o.finish[0], d.frames_with[rid]


@pytest.mark.parametrize("text", [STORY, LIST], ids=["story", "drafted"])
@pytest.mark.parametrize("hold", [False, True], ids=["streamed", "held"])
def test_running_ahead_answers_token_for_token_as_the_full_step(
    pair: tuple[EngineDriver, EngineDriver], text: str, hold: bool
) -> None:
    ahead, full = pair
    before = ahead.engine.ahead.steps
    got, want = answer(ahead, text, 96, hold=hold), answer(full, text, 96, hold=hold)
    assert got[:2] == want[:2]
    assert len(got[0]) == 96 and got[1] == "length"
    # The same drafts, verified alike (n-gram speculation is on, as in the worker).
    assert (ahead.engine.spec.drafted, ahead.engine.spec.accepted) == (full.engine.spec.drafted, full.engine.spec.accepted)
    assert full.engine.ahead.steps == 0
    steps = ahead.engine.ahead.steps - before
    # Streamed: a frame per step, the same steps either way; all but the first (the
    # prompt's) and one in LIMIT ran ahead. Held: the first token's frame and the end's.
    assert got[2] == want[2]
    if hold:
        assert got[2] == 2 and steps > 0
    else:
        assert steps >= (got[2] - 1) * (LIMIT - 1) // LIMIT - 1, (steps, got[2])
    for d in pair:
        assert d.engine.kv.repairs == 0
        assert d.cell_problems() == []
        assert d.engine.hold.holding == 0


def test_a_stop_string_met_while_running_ahead_ends_the_answer_where_the_full_step_does(
    pair: tuple[EngineDriver, EngineDriver],
) -> None:
    ahead, full = pair
    # Both engines see the same requests in the same order, so that their caches (and the
    # batch shapes that prefix reuse leads to) stay alike.
    tokens, _, _ = answer(full, STORY, 60)
    assert answer(ahead, STORY, 60)[0] == tokens
    words = full.model.detokenize(tokens).split()
    stop = words[len(words) // 2]  # a word from the middle of the answer
    got, want = answer(ahead, STORY, 60, stop=[stop]), answer(full, STORY, 60, stop=[stop])
    assert got[:2] == want[:2]
    assert got[1] == "stop" and len(got[0]) < 60


def test_a_request_that_arrives_while_one_runs_ahead_starts_at_once(pair: tuple[EngineDriver, EngineDriver]) -> None:
    ahead, _ = pair
    d = ahead
    rid, long = d.generate(d.model.tokenize(STORY), 400)
    start = d.engine.ahead.steps
    while d.engine.ahead.steps < start + 10:
        assert not long.done.wait(0.01), "the long request ended before running ahead"
    t0 = time.monotonic()
    _, short = d.generate(d.model.tokenize("Say hello."), 1)
    assert short.done.wait(60) and short.error is None
    waited = time.monotonic() - t0
    assert not long.done.is_set(), "the second request waited for the first one's end"
    # Its prompt's decode and a step or two of the first one's, not LIMIT of them.
    assert waited < 2.0, waited
    d.cancel(rid)
    d.wait_idle()
    assert d.cell_problems() == []


def test_a_cancel_reaches_a_stream_running_ahead_within_a_step(pair: tuple[EngineDriver, EngineDriver]) -> None:
    d, _ = pair
    rid, o = d.generate(d.model.tokenize(STORY), 600, hold=True)
    start = d.engine.ahead.steps
    while d.engine.ahead.steps < start + 5:
        assert not o.done.wait(0.01)
    t0 = time.monotonic()
    d.cancel(rid)
    d.wait_idle()
    assert time.monotonic() - t0 < 2.0
    assert all(s.request is None for s in d.engine.slots)
    assert d.engine.hold.holding == 0
    assert d.cell_problems() == []


def test_the_kv_check_runs_before_every_step_ahead_and_repairs_what_it_finds(
    pair: tuple[EngineDriver, EngineDriver],
) -> None:
    """Books made to disagree with the cells in the middle of running ahead: the check of
    the next step finds it, drops the sequence and counts it, and the request decodes its
    tokens again and still gives all it was asked for."""
    d, _ = pair
    kv = d.engine.kv
    real = kv.check
    calls = {"ahead": 0}
    tampered = threading.Event()

    def check(slots: list[Slot[object]], on_drop: object) -> int:
        if len(slots) == 1 and slots[0].request is not None:  # run-ahead's: its one slot
            calls["ahead"] += 1
            if calls["ahead"] == 3 and not tampered.is_set():
                slots[0].cache.append(7)  # a token with no cell: the books now lie
                tampered.set()
        return real(slots, on_drop)  # type: ignore[arg-type]

    kv.check = check  # type: ignore[method-assign]
    repairs = kv.repairs
    try:
        tokens, finish, _ = answer(d, STORY, 80)
    finally:
        kv.check = real  # type: ignore[method-assign]
    assert tampered.is_set()
    assert kv.repairs == repairs + 1
    assert len(tokens) == 80 and finish == "length"
    assert d.cell_problems() == []
