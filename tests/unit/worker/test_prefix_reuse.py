"""worker/prefix_reuse.py: where a prompt's cached prefix comes from, what is parked, what
is anchored, whom a request waits for, and what is evicted first (issue 24, item 2; the
late-sibling cases are issue 10's and issue 20's)."""

from __future__ import annotations

import random
from typing import Sequence

from hypothesis import given
from hypothesis import strategies as st

from worker.prefix_reuse import (
    ANCHOR_MIN, FOLLOW_MIN, PARK_MIN_TAIL, SPILL_AFTER, Prefilling, Start, eviction_order, follow_target,
    idle_to_spill, plan_start, wants_anchor,
)
from worker.slots import Slot, common_prefix, reusable_prefix

PROMPT = [1, 2, 3, 4, 5, 6]


def seq(seq_id: int, cache: Sequence[int] = (), busy: bool = False, last_used: int = 0, anchor: bool = False) -> Slot[str]:
    return Slot(seq_id=seq_id, cache=list(cache), request="r" if busy else None, last_used=last_used, anchor=anchor)


# ---- the late sibling's cases, now any request's ------------------------------------------------


def test_the_longest_cached_prefix_comes_from_any_slot_busy_or_idle() -> None:
    leader = seq(0, PROMPT + [9, 9], busy=True)  # still generating
    other = seq(1, PROMPT[:3])
    chosen = seq(2, [7, 7])
    # All but the last prompt token: its logits must be computed again to sample from.
    assert plan_start(chosen, [leader, other], [], PROMPT) == Start(leader, len(PROMPT) - 1, park=True)
    # What the chosen slot held is parked rather than overwritten (worker/kv_entries.py).


def test_nothing_is_copied_that_the_kv_cache_no_longer_holds() -> None:
    """Issue 20: a sequence whose sliding-window cells have moved past the prompt cannot
    give it; copying it anyway decoded the rest of the prompt over missing cells."""
    leader = seq(0, PROMPT + [9, 9], busy=True)
    other = seq(1, PROMPT[:3])
    chosen = seq(2)

    def usable(s: Slot[str], n: int) -> int:
        return 0 if s is leader else n

    assert plan_start(chosen, [leader, other], [], PROMPT, usable) == Start(other, 3)
    assert plan_start(chosen, [leader], [], PROMPT, usable) == Start(None, 0)


def test_the_own_slot_counts_only_what_it_can_keep() -> None:
    chosen = seq(1, PROMPT + [8])
    other = seq(0, PROMPT[:2])

    def usable(s: Slot[str], n: int) -> int:
        return 0 if s is chosen else n

    assert plan_start(chosen, [other], [], PROMPT, usable) == Start(other, 2, park=True)


def test_the_own_slot_wins_a_tie() -> None:
    chosen = seq(1, PROMPT)
    assert plan_start(chosen, [seq(0, PROMPT)], [], PROMPT) == Start(None, len(PROMPT) - 1)


# ---- parked entries -----------------------------------------------------------------------------

SYSTEM = list(range(100, 100 + ANCHOR_MIN + 10))
CONV_A = SYSTEM + list(range(1000, 1017))  # a short question after the shared prompt
CONV_B = SYSTEM + list(range(2000, 2017))


def test_a_returning_conversation_takes_its_parked_entry_whole() -> None:
    entry = seq(5, CONV_A)
    slot = seq(0, CONV_B)
    prompt = CONV_A + [7, 7, 7]
    start = plan_start(slot, [], [entry], prompt)
    # The slot swaps sequences with the entry (no copy); what the slot held is parked.
    assert start == Start(entry, len(CONV_A), take=True, park=True)


def test_another_users_slot_contents_are_parked_not_overwritten() -> None:
    slot = seq(0, CONV_A)
    prompt = CONV_B + [7]
    start = plan_start(slot, [], [], prompt)
    assert start == Start(None, len(SYSTEM), park=True)


def test_a_conversation_the_prompt_continues_is_not_parked() -> None:
    slot = seq(0, CONV_A)
    assert plan_start(slot, [], [], CONV_A + [6, 6]) == Start(None, len(CONV_A))
    assert PARK_MIN_TAIL == 1  # any other tail is someone's conversation


def test_a_shared_prefix_copied_from_another_conversation_is_anchored_once() -> None:
    busy = seq(1, CONV_A, busy=True)
    slot = seq(0)
    start = plan_start(slot, [busy], [], CONV_B)
    assert start == Start(busy, len(SYSTEM), anchor=True)
    anchor = seq(7, SYSTEM, anchor=True)
    # The anchor gives the prefix (a parked entry wins a tie), copied, never taken.
    assert plan_start(slot, [busy], [anchor], CONV_B) == Start(anchor, len(SYSTEM))
    # No free sequence id: no anchor.
    assert plan_start(slot, [busy], [], CONV_B, anchors_allowed=False) == Start(busy, len(SYSTEM))
    assert wants_anchor([], CONV_B, len(SYSTEM))
    assert not wants_anchor([anchor], CONV_B, len(SYSTEM))
    assert not wants_anchor([], CONV_B, ANCHOR_MIN - 1)


def test_an_entry_with_a_long_tail_is_copied_from_and_stays() -> None:
    entry = seq(5, CONV_A)
    slot = seq(0)
    start = plan_start(slot, [], [entry], CONV_B)
    assert start.source is entry and not start.take and start.n == len(SYSTEM)


@given(
    caches=st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=5),
    prompt=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    n_parked=st.integers(0, 4),
    refused=st.sets(st.integers(0, 4)),
)
def test_a_start_never_promises_more_than_its_source_can_give(
    caches: list[list[int]], prompt: list[int], n_parked: int, refused: set[int]
) -> None:
    """Whatever the sequences hold: the plan keeps a prefix of the prompt shorter than the
    prompt, that its source holds and can give, and no other sequence gives more."""
    seqs = [seq(i, c) for i, c in enumerate(caches)]
    slot, rest = seqs[0], seqs[1:]
    parked, others = rest[:n_parked], rest[n_parked:]

    def usable(s: Slot[str], n: int) -> int:
        return 0 if s.seq_id in refused else n

    start = plan_start(slot, others, parked, prompt, usable)
    source = slot if start.source is None else start.source
    assert 0 <= start.n < len(prompt)
    assert start.n <= common_prefix(source.cache, prompt)
    assert start.n == 0 or source.seq_id not in refused
    best = max(usable(s, reusable_prefix(s.cache, prompt)) for s in seqs)
    assert start.n == best
    if start.take:
        assert start.source in parked


# ---- waiting for a prefix another request is decoding ---------------------------------------------


def test_a_request_waits_for_one_prefilling_a_long_shared_prefix() -> None:
    leader = seq(0, SYSTEM[:10], busy=True)
    target = follow_target(CONV_B, 0, [Prefilling(leader, CONV_A)])
    assert target == (leader, len(SYSTEM))


def test_nobody_waits_to_save_a_few_tokens_or_for_what_is_decoded_already() -> None:
    leader = seq(0, [], busy=True)
    short = SYSTEM[: FOLLOW_MIN - 2] + [9]  # FOLLOW_MIN - 1 shared tokens
    assert follow_target(short + [1], 0, [Prefilling(leader, short + [2])]) is None
    assert follow_target(CONV_B, len(SYSTEM) - FOLLOW_MIN + 1, [Prefilling(leader, CONV_A)]) is None
    done = seq(1, SYSTEM, busy=True)
    assert follow_target(CONV_B, 0, [Prefilling(done, CONV_A)]) is None


def test_the_request_waited_for_is_the_one_with_the_longest_shared_prefix() -> None:
    a, b = seq(0, [], busy=True), seq(1, [], busy=True)
    target = follow_target(CONV_A + [1], 0, [Prefilling(a, CONV_B), Prefilling(b, CONV_A + [2])])
    assert target == (b, len(CONV_A))
    # Never the whole prompt: its last token is decoded for its logits.
    assert follow_target(CONV_A, 0, [Prefilling(b, CONV_A + [2])]) == (b, len(CONV_A) - 1)


# ---- eviction -------------------------------------------------------------------------------------


def test_least_recently_used_entries_go_first_and_anchors_last() -> None:
    old, new = seq(1, [1], last_used=1), seq(2, [2], last_used=5)
    anchor = seq(3, [3], last_used=2, anchor=True)
    assert eviction_order([new, anchor, old]) == [old, new, anchor]
    # An anchor left unused for more than a round of entries goes before a fresh entry.
    recent = seq(4, [4], last_used=20)
    assert eviction_order([recent, anchor])[0] is anchor


def test_eviction_order_is_a_permutation() -> None:
    rng = random.Random(3)
    for _ in range(100):
        entries = [seq(i, [i], last_used=rng.randint(0, 9), anchor=rng.random() < 0.3) for i in range(rng.randint(0, 8))]
        assert sorted(e.seq_id for e in eviction_order(entries)) == list(range(len(entries)))


# ---- idle entries out to host memory ----------------------------------------------------------------


def idle(seq_id: int, cache: Sequence[int], steps: int, anchor: bool = False) -> Slot[str]:
    entry = seq(seq_id, cache, anchor=anchor)
    entry.idle_steps = steps
    return entry


def test_an_entry_unused_for_spill_after_steps_goes_the_longest_idle_first() -> None:
    """Each parked cell lengthens every decode step's attention (bench/results/throughput-pairs-*):
    an entry nobody used for SPILL_AFTER steps moves to host memory, one at a time."""
    fresh = idle(4, [4] * 50, SPILL_AFTER - 1)
    older = idle(5, [5] * 50, SPILL_AFTER)
    oldest = idle(6, [6] * 50, SPILL_AFTER * 3)
    assert idle_to_spill([fresh], []) is None
    assert idle_to_spill([fresh, older, oldest], []) is oldest
    assert idle_to_spill([fresh, older], []) is older


def test_anchors_and_empty_entries_stay() -> None:
    anchor = idle(4, [4] * 300, SPILL_AFTER * 10, anchor=True)
    empty = idle(5, [], SPILL_AFTER * 10)
    assert idle_to_spill([anchor, empty], []) is None


def test_an_entry_that_shares_a_long_prefix_with_another_sequence_stays() -> None:
    """Its shared cells would stay (another sequence holds them), and a restore would write
    them again as its own copy: the sharing that agent-like load is served by would be lost."""
    system = list(range(ANCHOR_MIN))
    conversation = idle(4, system + [7, 8, 9], SPILL_AFTER * 2)
    slot = seq(0, system + [1, 2], busy=True)
    assert idle_to_spill([conversation], [slot]) is None
    sibling = idle(5, system + [3], 0)
    assert idle_to_spill([conversation, sibling], []) is None
    # A short common start (a template's first tokens) is no sharing worth keeping.
    other = seq(0, system[: ANCHOR_MIN - 1] + [99], busy=True)
    assert idle_to_spill([conversation], [other]) is conversation


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 300), st.integers(0, 3 * SPILL_AFTER), st.booleans()),
                max_size=8),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 300)), max_size=4))
def test_what_is_spilled_is_always_an_idle_unshared_conversation(
    entries: list[tuple[int, int, int, bool]], slots: list[tuple[int, int]]
) -> None:
    def tokens(family: int, n: int) -> list[int]:
        return [family] * n  # one family shares every token: prefixes of every length

    parked = [idle(10 + i, tokens(f, n), steps, anchor) for i, (f, n, steps, anchor) in enumerate(entries)]
    others = [seq(i, tokens(f, n), busy=True) for i, (f, n) in enumerate(slots)]

    def eligible(e: Slot[str]) -> bool:
        shared = max((common_prefix(s.cache, e.cache) for s in (*parked, *others) if s is not e), default=0)
        return not e.anchor and bool(e.cache) and e.idle_steps >= SPILL_AFTER and shared < ANCHOR_MIN

    chosen = idle_to_spill(parked, others)
    if chosen is None:
        assert not any(eligible(e) for e in parked)
    else:
        assert eligible(chosen)
        assert chosen.idle_steps == max(e.idle_steps for e in parked if eligible(e))


def test_another_scopes_cells_are_never_reused_and_a_slot_holding_them_parks_them() -> None:
    # Issue 40: the prefix cache was shared by every key, and the cached-token count told a
    # key whether it had guessed another key's prompt.
    from worker.slots import choose_slot, scoped

    theirs = seq(0, PROMPT + [9])
    theirs.scope = "alice"
    mine = seq(1, PROMPT[:2])
    mine.scope = "bob"
    usable = scoped(lambda s, n: n, "bob")
    assert choose_slot([theirs, mine], PROMPT, usable) is mine
    # Choosing alice's slot for bob (the only idle one) keeps nothing of it: parked, not served.
    assert plan_start(theirs, [], [], PROMPT, usable) == Start(None, 0, park=True)
    assert plan_start(mine, [], [], PROMPT, usable) == Start(None, 2)


@given(
    st.lists(st.tuples(st.sampled_from(["", "alice", "bob"]), st.lists(st.integers(0, 3), max_size=8)), min_size=1, max_size=8),
    st.sampled_from(["", "alice", "bob"]),
    st.lists(st.integers(0, 3), min_size=1, max_size=8),
)
def test_no_start_takes_cells_of_another_scope(
    sequences: list[tuple[str, list[int]]], scope: str, prompt: list[int]
) -> None:
    from worker.slots import scoped

    slots = []
    for i, (s, cache) in enumerate(sequences):
        slot = seq(i, cache)
        slot.scope = s
        slots.append(slot)
    chosen, others = slots[0], [s for s in slots[1:] if s.scope == scope]
    start = plan_start(chosen, others, [], prompt, scoped(lambda s, n: n, scope))
    source = start.source if start.source is not None else chosen
    if start.n > 0:
        assert source.scope == scope
