"""A non-streaming request's events (Generate.hold_events) cross to the router in two
frames, its first and its last, and say exactly what a streaming one's say
(worker/event_hold.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import DEMO_MODEL
from tests.e2e.engine_driver import EngineDriver
from tests.e2e.test_kv_mixes import CANARY_TEXT, CANARY_TOKENS
from worker.protocol import WorkerSpec


@pytest.fixture(scope="module")
def driver() -> Iterator[EngineDriver]:
    yield EngineDriver(WorkerSpec(name="demo", path=str(DEMO_MODEL), slots=2, n_ctx=1024))


def test_held_and_streamed_answers_agree_and_the_held_one_takes_two_frames(driver: EngineDriver) -> None:
    # The canary of tests/e2e/test_kv_mixes.py: its greedy answer has a wide margin at every
    # token, so that a cached prefix or another batch shape cannot flip it.
    prompt = driver.model.tokenize(CANARY_TEXT)
    outcomes = {}
    for hold in (False, True):
        for n in (1, 3):
            rid, o = driver.generate(prompt, CANARY_TOKENS, 0.0, None, n, logprobs=2, hold=hold)
            assert o.done.wait(120) and o.error is None, o.error
            outcomes[hold, n] = (rid, o)
    for n in (1, 3):
        streamed, held = outcomes[False, n][1], outcomes[True, n][1]
        assert held.tokens == streamed.tokens and held.finish == streamed.finish
        assert [[lp.token for lp in v] for v in held.logprobs.values()] == [
            [lp.token for lp in v] for v in streamed.logprobs.values()
        ]
        assert all(len(t) == CANARY_TOKENS for t in held.tokens.values()), held.tokens
        # Streamed: a frame per step. Held: the first step's, then the end's (each of n
        # choices may end in a step of its own).
        assert driver.frames_with[outcomes[False, n][0]] >= CANARY_TOKENS
        assert 2 <= driver.frames_with[outcomes[True, n][0]] <= 1 + n
    driver.wait_idle()
    assert driver.engine.hold.holding == 0


def test_a_cancelled_held_request_leaves_nothing_held(driver: EngineDriver) -> None:
    prompt = driver.model.tokenize("Write a very long story about the sea.")
    rid, o = driver.generate(prompt, 400, hold=True)
    while driver.frames_with[rid] == 0:  # its first token is out: it runs
        assert not o.done.wait(0.01)
    assert driver.engine.hold.holding == 1
    driver.cancel(rid)
    driver.wait_idle()
    assert driver.engine.hold.holding == 0
