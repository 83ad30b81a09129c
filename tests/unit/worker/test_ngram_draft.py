"""worker/ngram_draft.py: n-gram lookup drafts and their adaptive length (issue 24, item 4)."""

from __future__ import annotations

from typing import Sequence

from hypothesis import given
from hypothesis import strategies as st

from worker.ngram_draft import CANDIDATES, KEY, LONGEST, N_MIN, Drafter, NgramIndex


def naive(tokens: Sequence[int], k: int) -> list[int]:
    """The definition: among the latest CANDIDATES earlier occurrences of the sequence's last
    KEY tokens (else its last N_MIN), the one whose match reaches furthest back (at most
    LONGEST tokens), the latest among equals; the k tokens after it."""
    L = len(tokens)
    for n in (KEY, N_MIN):
        if L < n:
            continue
        ends = [e for e in range(n, L) if list(tokens[e - n : e]) == list(tokens[L - n :])]
        if not ends:
            continue
        def reach(e: int) -> int:
            m = n
            while m < LONGEST and e - m - 1 >= 0 and tokens[e - m - 1] == tokens[L - m - 1]:
                m += 1
            return m
        best = max(reversed(ends[-CANDIDATES:]), key=reach)  # max keeps the first: the latest
        return list(tokens[best : best + k])
    return []


def test_a_repeated_span_is_drafted_from_its_earlier_occurrence() -> None:
    code = [10, 11, 12, 13, 14, 15, 16]
    tokens = [1, 2] + code + [3] + code[:3]
    assert NgramIndex().lookup(tokens, 4) == [13, 14, 15, 16]


def test_the_occurrence_that_matches_furthest_back_wins_over_a_later_one() -> None:
    # "x = item ." twice: after "a b" in the copy being written, after "c d" later on.
    first = [50, 51, 1, 2, 3, 60, 61]
    later = [70, 71, 1, 2, 3, 80, 81]
    tokens = first + later + [50, 51, 1, 2, 3]
    assert NgramIndex().lookup(tokens, 2) == [60, 61]


def test_no_guess_without_an_earlier_occurrence() -> None:
    assert NgramIndex().lookup([1, 2, 3, 4], 4) == []
    assert NgramIndex().lookup([], 4) == []


@given(
    steps=st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=6), min_size=1, max_size=8),
    k=st.integers(0, 5),
)
def test_the_incremental_index_drafts_what_the_definition_says(steps: list[list[int]], k: int) -> None:
    """Tokens arrive in pieces, as a prompt and then sampled tokens do; at every point the
    index agrees with a search of the whole sequence."""
    index = NgramIndex()
    tokens: list[int] = []
    for piece in steps:
        tokens += piece
        assert index.lookup(tokens, k) == naive(tokens, k)


def test_the_draft_length_follows_acceptance() -> None:
    d = Drafter(max_draft=16)
    start = d.length
    d.verified(start, start)
    assert d.length == 2 * start
    d.verified(d.length, 1)
    assert d.length == 2 and d.pause == 0
    for _ in range(10):
        d.verified(d.length, d.length)
    assert d.length == 16
    assert d.drafted > 0 and d.accepted > 0


def test_misses_in_a_row_pause_drafting_longer_each_time() -> None:
    d = Drafter(max_draft=16)
    tokens = [1, 2, 3, 9, 1, 2, 3]  # "1 2 3" occurred before: a guess is there
    pauses = []
    for _ in range(4):
        assert d.draft(tokens, 8), "no draft after the pause ended"
        d.verified(1, 0)
        pauses.append(d.pause)
        for _ in range(d.pause):
            assert d.draft(tokens, 8) == []
    assert pauses == [1, 3, 7, 15] and d.length == 1
    d.verified(1, 1)  # a hit ends the backoff
    d.verified(1, 0)
    assert d.pause == 1
