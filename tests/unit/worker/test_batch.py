"""The llama_batch buffer: a generating request's one token (written as scalars, the path
every step takes) lands exactly as a run written by slices would, whatever came before it
in the batch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.batch import BatchBuffer, BatchFull

MODES = ("none", "last", "all")
runs = st.lists(
    st.tuples(st.lists(st.integers(0, 262_143), min_size=1, max_size=5), st.integers(0, 4000), st.integers(0, 15),
              st.sampled_from(MODES)),
    max_size=12,
)


@given(runs)
@settings(max_examples=200, deadline=None)
def test_runs_land_as_the_model_says(plan: list[tuple[list[int], int, int, str]]) -> None:
    batch = BatchBuffer(64)
    want: list[tuple[int, int, int, int]] = []  # (token, pos, seq, logits) per entry
    for tokens, first, seq, mode in plan:
        assert batch.add(tokens, first, seq, mode) == len(want)
        for i, t in enumerate(tokens):
            wants_logits = mode == "all" or (mode == "last" and i == len(tokens) - 1)
            want.append((t, first + i, seq, int(wants_logits)))
    n = batch.struct().n_tokens
    assert n == len(want) == batch.n
    got = list(zip(batch.token[:n].tolist(), batch.pos[:n].tolist(), batch.seq[:n].tolist(), batch.logits[:n].tolist()))
    assert got == want
    assert batch.n_seq_id[:n].tolist() == [1] * n


def test_a_reused_entry_forgets_its_logits_flag() -> None:
    # Step one asks logits of entry 0; step two's "none" there must clear it, or llama.cpp
    # would compute (and the engine might read) logits nobody asked for.
    batch = BatchBuffer(4)
    batch.add([5], 0, 0, "last")
    batch.clear()
    batch.add([6], 1, 0, "none")
    assert batch.logits[0] == 0 and batch.token[0] == 6 and batch.pos[0] == 1


def test_a_full_batch_refuses_one_more_token() -> None:
    batch = BatchBuffer(2)
    batch.add([1, 2], 0, 0, "last")
    with pytest.raises(BatchFull):
        batch.add([3], 2, 0, "last")
    assert batch.n == 2
