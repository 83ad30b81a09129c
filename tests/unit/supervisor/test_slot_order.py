"""supervisor/slot_order.py: classes, fair shares between owners, aging (issue 44), as pure
rules over a simulated model: `capacity` slots, each grant held for its request's `hold`
steps, a request's slots granted only once its turn has come and they are free, as
supervisor/slot_queue.py does (without its lookahead)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.slot_order import BATCH, INTERACTIVE, NORMAL, SEEN_LATELY, Place, SlotOrder, Waiting, effective_class


@dataclass(frozen=True)
class Req:
    at: int  # arrival step
    owner: str
    rank: int
    slots: int
    hold: int  # steps its slots are held


@dataclass(frozen=True)
class Grant:
    t: int
    req: Req
    waited: float  # since its flow's last grant, or since the flow began (aging's clock)
    # owner and rank of every request in line just before the grant, this one included
    line: tuple[tuple[str, int], ...]


Check = Callable[[Grant], None]


def simulate(reqs: list[Req], capacity: int, aging: float) -> list[Grant]:
    """Every request's grant, in order. Steps: holds end, arrivals join, turns are served."""
    order = SlotOrder(aging)
    pending = sorted(enumerate(reqs), key=lambda ir: (ir[1].at, ir[0]))
    of: dict[Waiting, Req] = {}
    since: dict[Place, float] = {}  # each waiting flow's, kept here independently of order
    running: list[tuple[int, int]] = []  # (end, slots)
    busy, t, grants = 0, 0, []
    while pending or of or running:
        busy -= sum(n for end, n in running if end <= t)
        running = [(end, n) for end, n in running if end > t]
        while pending and pending[0][1].at <= t:
            r = pending.pop(0)[1]
            place = Place(r.rank, r.owner)
            since.setdefault(place, t)
            of[order.add(place, r.slots, t)] = r
        while (w := order.next(t)) is not None and busy + min(w.slots, capacity) <= capacity:
            r, n = of[w], min(w.slots, capacity)
            line = tuple((x.owner, x.rank) for x in of.values())
            grants.append(Grant(t, r, t - since[w.place], line))
            del of[w]
            order.served(w, n, t)
            if any(x.place == w.place for x in of):
                since[w.place] = t
            else:
                del since[w.place]
            busy += n
            running.append((t + r.hold, n))
        t += 1
    assert len(grants) == len(reqs) and len(order) == 0
    return grants


def reqs(owners: int = 4, ranks: tuple[int, ...] = (0, 1, 2), at: int = 40, slots: int = 3, hold: int = 5, size: int = 40) -> st.SearchStrategy[list[Req]]:
    one = st.builds(
        Req,
        at=st.integers(0, at),
        owner=st.sampled_from([chr(ord("a") + i) for i in range(owners)]),
        rank=st.sampled_from(ranks),
        slots=st.integers(1, slots),
        hold=st.integers(1, hold),
    )
    return st.lists(one, min_size=1, max_size=size)


@given(reqs(owners=1, ranks=(NORMAL,)), st.integers(1, 4), st.sampled_from([0.0, 3.0, 30.0]))
def test_one_class_and_one_owner_is_first_come_first_served(rs: list[Req], capacity: int, aging: float) -> None:
    # Today's line exactly: arrival order, and a big request never overtaken by small ones.
    grants = simulate(rs, capacity, aging)
    assert [g.req for g in grants] == [r for _, r in sorted(enumerate(rs), key=lambda ir: (ir[1].at, ir[0]))]


@given(reqs(), st.integers(1, 4), st.sampled_from([0.0, 1e6]))
def test_without_aging_a_better_class_is_always_served_first(rs: list[Req], capacity: int, aging: float) -> None:
    # Aging off (0), or on but never reached: no wait here comes near a million steps.
    for g in simulate(rs, capacity, aging):
        assert g.req.rank == min(rank for _, rank in g.line)


@given(reqs(at=0, ranks=(BATCH,), size=60), st.integers(1, 4))
def test_owners_waiting_all_along_stay_within_one_requests_slots(rs: list[Req], capacity: int) -> None:
    """Fair shares: every owner waiting from the start, none is ever more than the largest
    grant ahead of another while both still wait, however many requests each sent."""
    biggest = min(max(r.slots for r in rs), capacity)
    got: dict[str, int] = {}
    for g in simulate(rs, capacity, aging=0.0):
        waiting = {owner for owner, _ in g.line}
        got[g.req.owner] = got.get(g.req.owner, 0) + min(g.req.slots, capacity)
        counts = [got.get(o, 0) for o in waiting]
        assert max(counts) - min(counts) <= biggest, (g, got)


@given(reqs(ranks=(NORMAL,), size=50), st.integers(0, 40), st.integers(1, 3), st.integers(1, 4))
def test_a_lone_request_waits_for_one_grant_per_owner_already_waiting(
    rs: list[Req], at: int, slots: int, capacity: int
) -> None:
    """A key with one request is not kept behind another key's many: it waits for a grant
    to each owner already waiting when it came, at most."""
    lone = Req(at, "z", NORMAL, slots, 1)
    grants = simulate([*rs, lone], capacity, aging=0.0)
    mine = next(i for i, g in enumerate(grants) if g.req is lone)
    # Those in line when it came: arrived by then, granted at its step or later (a step's
    # arrivals join before its grants).
    ahead = {g.req.owner for g in grants if g.req.at <= at <= g.t} - {"z"}
    assert len([g for g in grants[:mine] if g.t >= at]) <= len(ahead)


@settings(max_examples=200)
@given(reqs(owners=5, at=60, size=60, hold=4), st.integers(1, 3), st.integers(1, 12))
def test_with_aging_every_flow_is_served_within_its_bound(rs: list[Req], capacity: int, aging: int) -> None:
    """No starvation: a flow (an owner's requests of one class) gone (rank + 1) × aging
    steps without a grant is ahead of every flow served or begun later, so it is served
    within one grant per flow, each within the longest hold."""
    flows = len({(r.owner, r.rank) for r in rs})
    longest = max(r.hold for r in rs)
    for g in simulate(rs, capacity, float(aging)):
        assert g.waited <= (g.req.rank + 1) * aging + flows * longest, g


def test_a_batch_request_is_served_under_a_flood_of_interactive_ones() -> None:
    # One slot, and a new interactive request from another key every step for ever after.
    aging = 10
    flood = [Req(t, f"k{t % 3}", INTERACTIVE, 1, 1) for t in range(200)]
    grants = simulate([Req(0, "batch", BATCH, 1, 1), *flood], 1, float(aging))
    at = next(g.t for g in grants if g.req.owner == "batch")
    assert 2 * aging <= at <= 3 * aging + 4  # kept out while it can be, served once it ages
    # Without aging, it waits for the whole flood.
    assert simulate([Req(0, "batch", BATCH, 1, 1), *flood], 1, 0.0)[-1].req.owner == "batch"


def test_fifty_requests_of_one_key_do_not_hold_back_another_keys_one() -> None:
    many = [Req(0, "a", NORMAL, 1, 1) for _ in range(50)]
    grants = simulate([*many, Req(1, "b", NORMAL, 1, 1)], 1, 0.0)
    assert [g.req.owner for g in grants][:3] == ["a", "a", "b"]  # one more of a's at most


def test_an_owners_old_backlog_does_not_age_past_its_class_as_a_block() -> None:
    # Aging counts from a flow's last grant: a's fifty, waiting since step 0, do not all
    # rise above b's one, come a step before a's would have risen by arrival alone.
    many = [Req(0, "a", BATCH, 1, 1) for _ in range(50)]
    grants = simulate([*many, Req(9, "b", BATCH, 1, 1)], 1, 10.0)
    assert next(g.t for g in grants if g.req.owner == "b") <= 11


def test_a_big_request_whose_turn_has_come_is_not_passed_by_small_ones() -> None:
    rs = [Req(0, "a", NORMAL, 1, 5), Req(1, "b", NORMAL, 2, 1), *(Req(2, "c", NORMAL, 1, 1) for _ in range(5))]
    grants = simulate(rs, 2, 0.0)
    assert [g.req.owner for g in grants][:2] == ["a", "b"] and grants[1].t == 5


def test_the_class_a_flow_stands_in_rises_one_per_aging_period() -> None:
    assert [effective_class(BATCH, w, 10.0) for w in (0, 9.9, 10, 25, 30, 45)] == [2, 2, 1, 0, -1, -2]
    assert effective_class(BATCH, 1e9, 0.0) == BATCH  # aging off


def test_a_lower_class_runs_ahead_only_while_no_better_class_came_lately() -> None:
    order = SlotOrder(aging=1000.0)
    batch = order.add(Place(BATCH, "a"), 1, 0.0)
    assert order.may_run_ahead(batch, 0.0)  # nobody better about
    interactive = order.add(Place(INTERACTIVE, "b"), 1, 1.0)
    assert order.may_run_ahead(interactive, 1.0) and not order.may_run_ahead(batch, 1.0)
    order.served(interactive, 1, 2.0)
    assert not order.may_run_ahead(batch, 1.0 + SEEN_LATELY - 0.5)
    assert order.may_run_ahead(batch, 1.0 + SEEN_LATELY)
    assert order.waiting_by_rank() == {BATCH: 1} and len(order) == 1


def test_fair_share_counts_start_again_once_nobody_waits() -> None:
    order = SlotOrder(aging=0.0)
    for _ in range(3):
        order.served(order.add(Place(NORMAL, "b"), 1, 0.0), 1, 0.0)
    # b's grants, with nobody waiting, were no one's loss: a gains no turns over b for them.
    a1, a2 = order.add(Place(NORMAL, "a"), 1, 1.0), order.add(Place(NORMAL, "a"), 1, 1.0)
    b = order.add(Place(NORMAL, "b"), 1, 1.0)
    served = []
    while (w := order.next(1.0)) is not None:
        order.served(w, 1, 1.0)
        served.append(w)
    assert served == [a1, b, a2]
