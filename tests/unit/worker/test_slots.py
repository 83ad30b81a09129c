"""worker/slots.py: prefix comparison, slot choice, and how much cache a prompt keeps."""

from __future__ import annotations

import random

import pytest

from worker.slots import Slot, choose_slot, common_prefix, reusable_prefix

# ---- common_prefix ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [
        ([], [], 0),
        ([], [1, 2], 0),
        ([1, 2], [], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2], [1, 2, 3], 2),
        ([1, 2, 3], [1, 9, 3], 1),
        ([5, 2, 3], [1, 2, 3], 0),
        ((1, 2, 3, 4), [1, 2, 3, 5], 3),
    ],
)
def test_common_prefix(a: list[int], b: list[int], n: int) -> None:
    assert common_prefix(a, b) == n
    assert common_prefix(b, a) == n


def test_common_prefix_random_agrees_with_naive() -> None:
    rng = random.Random(7)
    for _ in range(500):
        a = [rng.randint(0, 2) for _ in range(rng.randint(0, 8))]
        b = [rng.randint(0, 2) for _ in range(rng.randint(0, 8))]
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix(a, b) == n


# ---- choose_slot --------------------------------------------------------------------------------


def slot(
    seq_id: int, cache: list[int] | None = None, last_used: int = 0, busy: bool = False
) -> Slot[str]:
    return Slot(
        seq_id=seq_id, cache=list(cache or []), request="req" if busy else None, last_used=last_used
    )


def test_slot_idle_property() -> None:
    assert slot(0).idle
    assert not slot(0, busy=True).idle


def test_longest_prefix_wins() -> None:
    slots = [
        slot(0, [1, 2], last_used=1),
        slot(1, [1, 2, 3, 4], last_used=5),
        slot(2, [1, 2, 3], last_used=0),
    ]
    assert choose_slot(slots, [1, 2, 3, 4, 5]).seq_id == 1


def test_longest_prefix_beats_recency() -> None:
    # The slot with the longer prefix wins even if it was used more recently.
    slots = [slot(0, [9], last_used=0), slot(1, [1, 2], last_used=100)]
    assert choose_slot(slots, [1, 2, 3]).seq_id == 1


def test_a_longer_prefix_the_kv_cache_no_longer_holds_loses() -> None:
    """Issue 20: the slot with the longest matching tokens had given away the sliding-window
    cells that prefix needed; it kept winning the same prompt, which was answered from
    missing cells every time. What counts is what the cells can still give."""
    slots = [slot(0, [1, 2, 3, 4, 9, 9], last_used=1), slot(1, [1, 2], last_used=5)]

    def usable(s: Slot[object], n: int) -> int:
        return 0 if s.seq_id == 0 else n

    assert choose_slot(slots, [1, 2, 3, 4, 5]).seq_id == 0  # without the question
    assert choose_slot(slots, [1, 2, 3, 4, 5], usable).seq_id == 1


def test_tie_goes_to_least_recently_used() -> None:
    slots = [
        slot(0, [1, 2, 7], last_used=5),
        slot(1, [1, 2, 8], last_used=2),
        slot(2, [1, 2, 9], last_used=9),
    ]
    assert choose_slot(slots, [1, 2, 3]).seq_id == 1


def test_zero_prefix_goes_to_least_recently_used() -> None:
    slots = [slot(0, [4], last_used=3), slot(1, [5], last_used=1), slot(2, [], last_used=2)]
    assert choose_slot(slots, [1, 2, 3]).seq_id == 1


def test_lru_choice_does_not_depend_on_order() -> None:
    rng = random.Random(3)
    base = [slot(i, [100 + i], last_used=u) for i, u in enumerate([4, 0, 7, 2])]
    for _ in range(20):
        rng.shuffle(base)
        assert choose_slot(base, [1]).seq_id == 1


def test_busy_slots_never_chosen() -> None:
    slots = [
        slot(0, [1, 2, 3], last_used=0, busy=True),  # best prefix and oldest, but busy
        slot(1, [1], last_used=10),
        slot(2, [], last_used=20),
    ]
    assert choose_slot(slots, [1, 2, 3]).seq_id == 1


def test_busy_lru_slot_not_chosen_for_zero_prefix() -> None:
    slots = [slot(0, [], last_used=0, busy=True), slot(1, [], last_used=5)]
    assert choose_slot(slots, [1]).seq_id == 1


def test_none_when_all_busy() -> None:
    slots = [slot(0, [1], busy=True), slot(1, [1, 2], busy=True)]
    assert choose_slot(slots, [1, 2]) is None


def test_none_when_no_slots() -> None:
    assert choose_slot([], [1, 2]) is None


def test_empty_prompt_gets_lru_idle_slot() -> None:
    slots = [slot(0, [1], last_used=2), slot(1, [2], last_used=1)]
    assert choose_slot(slots, []).seq_id == 1


def test_choose_slot_random_agrees_with_spec() -> None:
    rng = random.Random(11)
    for _ in range(300):
        n = rng.randint(1, 6)
        uses = rng.sample(range(50), n)  # distinct clocks: the answer is unique
        slots = [
            slot(
                i,
                [rng.randint(0, 2) for _ in range(rng.randint(0, 5))],
                uses[i],
                rng.random() < 0.3,
            )
            for i in range(n)
        ]
        prompt = [rng.randint(0, 2) for _ in range(rng.randint(0, 6))]
        idle = [s for s in slots if s.idle]
        got = choose_slot(slots, prompt)
        if not idle:
            assert got is None
            continue
        # Ranked by what the prompt would keep: a slot holding the whole prompt keeps as much
        # as one holding all but its last token (that one is decoded again either way).
        best = max(reusable_prefix(s.cache, prompt) for s in idle)
        want = min(
            (s for s in idle if reusable_prefix(s.cache, prompt) == best), key=lambda s: s.last_used
        )
        assert got is want


# ---- reusable_prefix ----------------------------------------------------------------------------


def test_reusable_partial_prefix() -> None:
    assert reusable_prefix([1, 2, 3, 9], [1, 2, 3, 4, 5]) == 3


def test_reusable_nothing_in_common() -> None:
    assert reusable_prefix([7, 8], [1, 2]) == 0
    assert reusable_prefix([], [1, 2]) == 0


def test_reusable_backs_off_when_cache_covers_whole_prompt() -> None:
    # Identical: one token must be decoded again for its logits.
    assert reusable_prefix([1, 2, 3], [1, 2, 3]) == 2
    # Cache longer than the prompt and covering it entirely.
    assert reusable_prefix([1, 2, 3, 4, 5], [1, 2, 3]) == 2


def test_reusable_cache_is_prefix_of_prompt_keeps_all() -> None:
    assert reusable_prefix([1, 2], [1, 2, 3]) == 2


def test_reusable_never_negative() -> None:
    assert reusable_prefix([], []) == 0
    assert reusable_prefix([1, 2], []) == 0
    assert reusable_prefix([1], [1]) == 0


def test_reusable_random_invariants() -> None:
    rng = random.Random(5)
    for _ in range(500):
        cache = [rng.randint(0, 2) for _ in range(rng.randint(0, 6))]
        prompt = [rng.randint(0, 2) for _ in range(rng.randint(0, 6))]
        keep = reusable_prefix(cache, prompt)
        assert 0 <= keep <= common_prefix(cache, prompt)
        # At least one prompt token is always left to decode (when there is one).
        if prompt:
            assert keep <= len(prompt) - 1
            assert keep == min(common_prefix(cache, prompt), len(prompt) - 1)
        else:
            assert keep == 0


def test_common_prefix_of_long_sequences_agrees_with_naive_across_chunk_boundaries() -> None:
    """The chunked comparison (256 tokens a slice) finds the first difference wherever it
    falls: before, at and after a chunk's edge, in either argument, or nowhere."""
    rng = random.Random(24)
    base = [rng.randint(0, 5) for _ in range(1200)]
    for at in (0, 1, 255, 256, 257, 511, 512, 700, 1023, 1199):
        other = list(base)
        other[at] += 1
        assert common_prefix(base, other) == at == common_prefix(other, base)
        assert common_prefix(base[: at + 3], other) == at
    assert common_prefix(base, base[:900]) == 900
    assert common_prefix(tuple(base), base) == 1200
