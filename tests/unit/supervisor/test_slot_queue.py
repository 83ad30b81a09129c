"""The slot line: arrival order, the max_queue bound, queue_timeout, Retry-After, and the
turns of classes and keys."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from supervisor.errors import Overloaded, WorkerUnavailable
from supervisor.slot_order import BATCH, INTERACTIVE, SEEN_LATELY, Place
from supervisor.slot_queue import RETRY_AFTER_MAX, SlotQueue, Ticket


# A queue_timeout long enough never to end a wait: with one, every waiting request waits in
# the line (no lookahead into the worker), which these tests watch.
LINE = 3600.0


def _queue(capacity: int) -> SlotQueue:
    q = SlotQueue("m")
    q.resize(capacity)
    return q


async def test_free_slots_are_taken_at_once_and_given_back() -> None:
    q = _queue(2)
    a = await q.take(1, None, 0)
    b = await q.take(1, None, 0)
    assert q.busy == 2 and q.waiting == 0
    a.release()
    a.release()  # idempotent
    assert q.busy == 1
    b.release()
    assert q.busy == 0


async def test_waiters_get_slots_in_arrival_order() -> None:
    q = _queue(1)
    first = await q.take(1, None, LINE)
    order: list[int] = []
    tickets: list[Ticket] = []

    async def wait(i: int) -> None:
        t = await q.take(1, None, LINE)
        order.append(i)
        tickets.append(t)

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(wait, i)
            await trio.testing.wait_all_tasks_blocked()
        assert q.waiting == 5 and order == []
        first.release()
        for expected in range(5):
            await trio.testing.wait_all_tasks_blocked()
            assert order == list(range(expected + 1))
            tickets[-1].release()
    assert q.busy == 0 and q.waiting == 0


async def test_a_big_request_is_not_overtaken_by_small_ones() -> None:
    q = _queue(2)
    small = await q.take(1, None, LINE)
    order: list[str] = []

    async def wait(name: str, slots: int) -> None:
        t = await q.take(slots, None, LINE)
        order.append(name)
        await trio.sleep(0.01)
        t.release()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "big", 2)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wait, "small", 1)  # one slot is free, but "big" came first
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and q.waiting == 2
        small.release()
    assert order == ["big", "small"]


async def test_more_slots_than_the_model_has_take_all_of_them() -> None:
    q = _queue(2)
    t = await q.take(8, None, 0)
    assert t.slots == 2 and q.busy == 2
    t.release()


async def test_past_max_queue_a_request_is_refused_at_once_with_an_estimate() -> None:
    q = _queue(1)
    running = await q.take(1, None, LINE)
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(q.take, 1, 2, LINE)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(Overloaded) as exc:
            await q.take(1, 2, LINE)
        assert "max_queue = 2" in exc.value.message
        # One hold assumed to take a second, and three holds (two waiting, then this one)
        # ahead on one slot.
        assert exc.value.retry_after == pytest.approx(3.0)
        # The next refused client is told to come a hold later: it is behind the first.
        with pytest.raises(Overloaded) as second:
            await q.take(1, 2, LINE)
        assert second.value.retry_after == pytest.approx(4.0)
        nursery.cancel_scope.cancel()
    running.release()
    assert q.waiting == 0 and q.busy == 0


async def test_max_queue_zero_means_no_waiting() -> None:
    q = _queue(1)
    t = await q.take(1, 0, 0)
    with pytest.raises(Overloaded):
        await q.take(1, 0, 0)
    t.release()
    (await q.take(1, 0, 0)).release()


async def test_queue_timeout_gives_up_with_a_503_and_leaves_the_line(autojump_clock: trio.abc.Clock) -> None:
    q = _queue(1)
    running = await q.take(1, None, 0)
    with pytest.raises(WorkerUnavailable) as exc:
        await q.take(1, None, 2.5)
    assert "queue_timeout = 2.5s" in exc.value.message and exc.value.retry_after is not None
    assert q.waiting == 0
    running.release()
    assert q.busy == 0


async def test_a_waiter_that_leaves_lets_the_next_one_in() -> None:
    q = _queue(2)
    held = await q.take(1, None, LINE)
    got: list[int] = []

    async def big() -> None:
        await q.take(2, None, LINE)

    async def small() -> None:
        t = await q.take(1, None, LINE)
        got.append(t.slots)

    leaving = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run_in, leaving, big)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(small)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # behind "big"
        leaving.cancel()
        await trio.testing.wait_all_tasks_blocked()
    assert got == [1] and q.busy == 2
    held.release()


async def _run_in(scope: trio.CancelScope, f) -> None:  # type: ignore[no-untyped-def]
    with scope:
        await f()


async def test_a_grant_that_meets_a_cancelled_client_is_given_back() -> None:
    q = _queue(1)
    held = await q.take(1, None, LINE)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(q.take, 1, None, LINE)
        await trio.testing.wait_all_tasks_blocked()
        # The waiter is cancelled, and the slot granted to it before it runs again: it
        # must not keep it.
        nursery.cancel_scope.cancel()
        held.release()
    assert q.busy == 0 and q.waiting == 0


async def test_retry_after_follows_recent_hold_times(autojump_clock: trio.abc.Clock) -> None:
    q = _queue(2)
    for _ in range(30):
        t = await q.take(1, None, 0)
        await trio.sleep(4.0)
        t.release()
    assert q.mean_hold == pytest.approx(4.0, rel=0.01)
    assert q.retry_after() == pytest.approx(4.0, rel=0.01)  # a slot is free within a hold
    for _ in range(30):
        t = await q.take(1, None, 0)
        await trio.sleep(500.0)
        t.release()
    assert q.retry_after() == RETRY_AFTER_MAX


async def test_a_smaller_worker_after_a_restart_still_serves_the_line() -> None:
    q = _queue(4)
    held = await q.take(4, None, LINE)
    got: list[int] = []

    async def wait() -> None:
        got.append((await q.take(3, None, LINE)).slots)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        q.resize(2)
        held.release()
    assert got == [2]


async def test_without_a_timeout_one_request_per_slot_waits_in_the_worker() -> None:
    q = _queue(2)
    running = [await q.take(1, None, 0) for _ in range(2)]
    # Two more go to the worker at once, to start the step a slot frees: still waiting.
    ahead = [await q.take(1, None, 0) for _ in range(2)]
    assert q.busy == 4 and q.waiting == 2
    order: list[int] = []

    async def wait(i: int) -> None:
        (await q.take(1, None, 0))
        order.append(i)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, 5)
        await trio.testing.wait_all_tasks_blocked()
        assert q.waiting == 3 and order == []  # the fifth waits here
        running[0].release()
        await trio.testing.wait_all_tasks_blocked()
        assert order == [5] and q.waiting == 2
    for t in (*running, *ahead):
        t.release()


async def test_max_queue_counts_the_requests_waiting_in_the_worker() -> None:
    q = _queue(1)
    held = [await q.take(1, 2, 0), await q.take(1, 2, 0)]  # running, and one in the worker
    assert q.waiting == 1
    async with trio.open_nursery() as nursery:
        nursery.start_soon(q.take, 1, 2, 0)  # in line here
        await trio.testing.wait_all_tasks_blocked()
        assert q.waiting == 2
        with pytest.raises(Overloaded):
            await q.take(1, 2, 0)
        nursery.cancel_scope.cancel()
    for t in held:
        t.release()
    # max_queue = 0 leaves no room to wait anywhere.
    z = _queue(1)
    t = await z.take(1, 0, 0)
    with pytest.raises(Overloaded):
        await z.take(1, 0, 0)
    t.release()


async def test_a_flood_of_refusals_stays_cheap_and_bounded(autojump_clock: trio.abc.Clock) -> None:
    q = _queue(1)
    held = await q.take(1, 0, 0)
    for _ in range(20_000):
        with pytest.raises(Overloaded):
            await q.take(1, 0, 0)
    # Promises stop at the 60 s horizon: the first guess of a 1 s hold gives 59 of them.
    assert len(q._promised) < 60 and q.retry_after() == RETRY_AFTER_MAX
    await trio.sleep(RETRY_AFTER_MAX + 1)
    assert q.retry_after() == pytest.approx(1.0)  # every promise has come due
    held.release()


# ---- classes, fair shares and aging (issue 44; the rules: tests/unit/supervisor/test_slot_order.py)

INTERACTIVE_KEY, BATCH_KEY = Place(INTERACTIVE, "i"), Place(BATCH, "b")


async def _served_in_order(q: SlotQueue, held: Ticket, places: list[tuple[str, Place]], timeout: float = LINE) -> list[str]:
    """The names of `places`' requests, each taking one slot, in the order they are served
    once `held` is released (they join the line one after another, in the order given)."""
    order: list[str] = []

    async def wait(name: str, place: Place) -> None:
        t = await q.take(1, None, timeout, place)
        order.append(name)
        await trio.sleep(0.01)
        t.release()

    async with trio.open_nursery() as nursery:
        for name, place in places:
            nursery.start_soon(wait, name, place)
            await trio.testing.wait_all_tasks_blocked()
        assert order == []
        held.release()
    return order


async def test_a_better_class_is_served_before_the_requests_already_waiting() -> None:
    q = _queue(1)
    # (held by the best class: nobody takes its slot back, so the order alone shows)
    held = await q.take(1, None, LINE, INTERACTIVE_KEY)
    places = [*((f"b{i}", BATCH_KEY) for i in range(3)), ("normal", Place()), ("i", INTERACTIVE_KEY)]
    assert await _served_in_order(q, held, places) == ["i", "normal", "b0", "b1", "b2"]


async def test_a_slot_a_worse_class_holds_is_granted_to_a_better_one_at_once() -> None:
    """The worker parks the worse one's request (worker/priority.py): the better one does
    not wait for it; one of the same or a worse class does."""
    q = _queue(1)
    batch = await q.take(1, None, LINE, BATCH_KEY)
    with trio.move_on_after(1):
        normal = await q.take(1, None, LINE, Place())
    assert q.busy == 2  # over the worker's one slot: the batch request is parked there
    with trio.move_on_after(1):
        urgent = await q.take(1, None, LINE, INTERACTIVE_KEY)
    assert q.busy == 3
    got: list[Ticket] = []

    async def another(place: Place) -> None:
        got.append(await q.take(1, None, LINE, place))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(another, INTERACTIVE_KEY)  # the interactive class's slot is taken
        nursery.start_soon(another, BATCH_KEY)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        urgent.release()
        await trio.testing.wait_all_tasks_blocked()
        assert len(got) == 1 and got[0].rank == 0
        for t in (got[0], normal, batch):
            t.release()
        await trio.testing.wait_all_tasks_blocked()
        assert len(got) == 2 and got[1].rank == 2
        got[1].release()
    assert q.busy == 0


async def test_a_key_with_one_request_waits_behind_one_of_anothers_many_not_all() -> None:
    q = _queue(1)
    a, b = Place(owner="a"), Place(owner="b")
    held = await q.take(1, None, LINE, a)
    places = [*((f"a{i}", a) for i in range(4)), ("b", b)]
    assert await _served_in_order(q, held, places) == ["a0", "b", "a1", "a2", "a3"]


async def test_a_request_that_aged_two_classes_goes_before_a_fresh_interactive_one(autojump_clock: trio.abc.Clock) -> None:
    q = SlotQueue("m", aging=10.0)
    q.resize(1)
    held = await q.take(1, None, LINE, INTERACTIVE_KEY)
    order: list[str] = []

    async def wait(name: str, place: Place) -> None:
        (await q.take(1, None, LINE, place)).release()
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "batch", BATCH_KEY)
        await trio.sleep(25.0)  # past two aging periods: it stands in the interactive class
        nursery.start_soon(wait, "i", INTERACTIVE_KEY)
        await trio.sleep(1.0)
        held.release()
    assert order == ["batch", "i"]


async def test_a_lower_class_is_not_handed_to_the_worker_ahead_while_a_better_one_is_about(
    autojump_clock: trio.abc.Clock,
) -> None:
    q = _queue(1)
    running = await q.take(1, None, 0, INTERACTIVE_KEY)
    got: list[Ticket] = []

    async def batch() -> None:
        got.append(await q.take(1, None, 0, BATCH_KEY))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batch)
        await trio.testing.wait_all_tasks_blocked()
        # It waits here, where an interactive request coming next can still pass it...
        assert q.busy == 1 and q.waiting == 1
        ahead = await q.take(1, None, 0, INTERACTIVE_KEY)  # ...as this one does
        assert q.busy == 2 and q.waiting_by_rank() == {INTERACTIVE: 1, BATCH: 1}
        running.release()
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and q.waiting_by_rank() == {BATCH: 1}  # "ahead" took the slot freed
        ahead.release()
    assert len(got) == 1 and q.busy == 1 and q.waiting == 0
    got[0].release()
    # Once no better class has come for a while, the lookahead is everyone's again.
    await trio.sleep(SEEN_LATELY)
    held = [await q.take(1, None, 0, BATCH_KEY) for _ in range(2)]
    assert q.busy == 2 and q.waiting_by_rank() == {BATCH: 1}
    for t in held:
        t.release()
