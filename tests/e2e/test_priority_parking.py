"""Issue 44, item 3, in the engine on the demo model: a request of a better class that finds
every slot busy with worse ones takes a slot back; the request it displaces is parked (its
cells kept, not dropped) and resumes later with exactly the greedy tokens it would have
made unparked, decoding again only its last sampled token."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from tests.e2e.conftest import DEMO_MODEL
from tests.e2e.engine_driver import EngineDriver
from worker.protocol import WorkerSpec

INTERACTIVE, NORMAL, BATCH = 0, 1, 2


@pytest.fixture(scope="module")
def driver() -> Iterator[EngineDriver]:
    yield EngineDriver(WorkerSpec(name="demo", path=str(DEMO_MODEL), slots=2, n_ctx=2048, spec_type="none"))


def until(cond: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_an_interactive_request_parks_the_newest_batch_one_which_resumes_unchanged(driver: EngineDriver) -> None:
    # Counting: greedy tokens that win by wide margins, so that no near-tie flips with the
    # batch's makeup (llama.cpp's sums are not batch-invariant), and any change is the park's.
    texts = ["Count: 1, 2, 3, 4, 5,", "Count: 300, 301, 302, 303,", "Count: 70, 71, 72, 73,"]
    prompts = [driver.model.tokenize(t) for t in texts]
    alone = [driver.run_alone(p, 40).tokens[0] for p in prompts]
    driver.wait_idle()
    parked0, resumed0 = driver.engine.room.parked, driver.engine.admission.tokens_resumed

    _, first = driver.generate(prompts[0], 40, priority=BATCH)
    until(lambda: len(first.tokens.get(0, [])) >= 3)
    _, second = driver.generate(prompts[1], 40, priority=BATCH)
    until(lambda: len(second.tokens.get(0, [])) >= 3)
    _, urgent = driver.generate(prompts[2], 40, priority=INTERACTIVE)
    assert urgent.done.wait(120) and urgent.error is None, urgent.error
    # It ran while both batch requests were unfinished: it did not wait for a slot to free.
    assert not first.done.is_set() or not second.done.is_set()
    assert first.done.wait(120) and second.done.wait(120)
    assert driver.engine.room.parked == parked0 + 1
    # The newest batch request was the one parked: it came back and found its cells.
    resumed = driver.engine.admission.tokens_resumed - resumed0
    assert resumed >= len(prompts[1]) + 3 - 1, resumed
    # Every request's greedy tokens are those it made alone.
    assert [first.tokens[0], second.tokens[0], urgent.tokens[0]] == alone
    driver.wait_idle()
    assert driver.cell_problems() == []


def test_requests_of_one_class_never_park_each_other(driver: EngineDriver) -> None:
    prompts = [driver.model.tokenize(f"Tale number {i}: once") for i in range(3)]
    before = driver.engine.room.parked
    outs = [driver.generate(p, 20, priority=NORMAL)[1] for p in prompts]
    for o in outs:
        assert o.done.wait(120) and o.error is None
    assert driver.engine.room.parked == before


def test_a_worse_class_waits_behind_a_better_one_that_came_later(driver: EngineDriver) -> None:
    p = [driver.model.tokenize(f"Line {i} of a poem:") for i in range(4)]
    driver.wait_idle()
    before = driver.engine.room.parked
    # One slot frees after 10 tokens, the other after 80.
    running = [driver.generate(p[i], n, priority=INTERACTIVE)[1] for i, n in enumerate((10, 80))]
    until(lambda: all(len(o.tokens.get(0, [])) >= 1 for o in running))
    _, low = driver.generate(p[2], 5, priority=BATCH)
    until(lambda: waiting_ranks(driver) == [BATCH])  # it is in line first
    _, high = driver.generate(p[3], 5, priority=INTERACTIVE)
    # The first slot to free went to the better class, though it came later: it was done
    # before the batch request had a token.
    assert high.done.wait(120)
    assert not low.tokens.get(0) and not low.done.is_set()
    assert low.done.wait(120) and all(o.done.wait(120) for o in running)
    # Nobody was parked: those running were of the best class.
    assert driver.engine.room.parked == before


def waiting_ranks(driver: EngineDriver) -> list[int] | None:
    """The ranks in the engine's line (read from this thread: a copy, retried if the engine
    changed it meanwhile)."""
    try:
        return [r.rank for r in list(driver.engine.requests.waiting)]
    except RuntimeError:
        return None
