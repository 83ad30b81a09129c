"""Each key's quotas (router/usage/quotas.py), decided on given clocks."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from router.usage.entries import DAY, day_of
from router.usage.quotas import WINDOW, QuotaBook
from supervisor.config.key_rules import KeyRules

OWNER = "ab" * 32
WALL = 1_795_000_000.0 + 3600  # an hour into a UTC day


def test_requests_per_minute_refuses_the_one_past_and_says_when_the_oldest_leaves() -> None:
    book, rules = QuotaBook(), KeyRules(requests_per_minute=3)
    for t in (0.0, 10.0, 20.0):
        assert book.admit(OWNER, rules, t, WALL) is None
        book.done(OWNER, 0, t, WALL)
    no = book.admit(OWNER, rules, 30.0, WALL)
    assert no is not None and no.limit == "requests_per_minute"
    assert no.retry_after == WINDOW - 30.0  # the start at 0 leaves at 60
    assert "requests_per_minute" in no.message and no.standing.requests_remaining == 0
    assert book.admit(OWNER, rules, 60.01, WALL) is None


def test_tokens_per_minute_charges_at_the_end_and_waits_for_enough_to_leave() -> None:
    book, rules = QuotaBook(), KeyRules(tokens_per_minute=100)
    for t, n in ((0.0, 60), (5.0, 50)):
        assert book.admit(OWNER, rules, t, WALL) is None
        book.done(OWNER, n, t + 1, WALL)
    no = book.admit(OWNER, rules, 10.0, WALL)
    assert no is not None and no.limit == "tokens_per_minute"
    # 110 used: once the 60 charged at t=1 leave (t=61), 50 < 100
    assert no.retry_after == 1.0 + WINDOW - 10.0
    assert book.admit(OWNER, rules, 61.5, WALL) is None


def test_tokens_per_day_ends_at_utc_midnight_and_a_seed_counts() -> None:
    book, rules = QuotaBook(), KeyRules(tokens_per_day=1000)
    book.seed_day({OWNER[:16]: 990}, WALL)
    assert book.admit(OWNER, rules, 0.0, WALL) is None
    book.done(OWNER, 20, 1.0, WALL)
    no = book.admit(OWNER, rules, 2.0, WALL)
    assert no is not None and no.limit == "tokens_per_day"
    assert abs(no.retry_after - (day_of(WALL) + DAY - WALL)) < 1e-6
    assert book.admit(OWNER, rules, 3.0, day_of(WALL) + DAY + 1) is None  # a new day


def test_in_flight_counts_until_done() -> None:
    book, rules = QuotaBook(), KeyRules(max_in_flight=2)
    assert book.admit(OWNER, rules, 0, WALL) is None
    assert book.admit(OWNER, rules, 0, WALL) is None
    no = book.admit(OWNER, rules, 0, WALL)
    assert no is not None and no.limit == "max_in_flight"
    book.done(OWNER, 5, 1, WALL)
    assert book.in_flight(OWNER) == 1
    assert book.admit(OWNER, rules, 1, WALL) is None


def test_keys_are_counted_apart_and_a_refusal_is_not_counted() -> None:
    book, rules = QuotaBook(), KeyRules(requests_per_minute=1)
    assert book.admit(OWNER, rules, 0, WALL) is None
    assert book.admit(OWNER, rules, 1, WALL) is not None
    assert book.admit(OWNER, rules, 2, WALL) is not None
    assert book.admit("cd" * 32, rules, 2, WALL) is None
    assert book.standing(OWNER, rules, 2, WALL).requests_remaining == 0
    assert book.admit(OWNER, rules, 60.5, WALL) is None  # the refusals did not push it out


def test_standing_reports_the_tighter_token_limit() -> None:
    book = QuotaBook()
    rules = KeyRules(tokens_per_minute=100, tokens_per_day=1000)
    book.seed_day({OWNER[:16]: 950}, WALL)
    st_ = book.standing(OWNER, rules, 0, WALL)
    assert (st_.tokens_limit, st_.tokens_remaining) == (1000, 50)
    assert st_.requests_limit is None


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0, 1.0), min_size=1, max_size=200), st.integers(1, 10))
def test_no_sixty_second_window_holds_more_admitted_requests_than_the_limit(gaps: list[float], limit: int) -> None:
    book, rules = QuotaBook(), KeyRules(requests_per_minute=limit)
    t, admitted = 0.0, []
    for gap in gaps:
        t += gap * 20
        no = book.admit(OWNER, rules, t, WALL)
        if no is None:
            admitted.append(t)
            book.done(OWNER, 1, t, WALL)
        else:  # and the wait it names is exact: just before it, still refused; just after, admitted
            assert copy.deepcopy(book).admit(OWNER, rules, t + no.retry_after + 1e-6, WALL) is None
            if no.retry_after > 1e-3:
                assert copy.deepcopy(book).admit(OWNER, rules, t + no.retry_after - 1e-3, WALL) is not None
    for a in admitted:
        assert sum(1 for b in admitted if a <= b < a + WINDOW) <= limit
