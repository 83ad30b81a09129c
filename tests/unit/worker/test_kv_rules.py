"""worker/kv_rules.py: what a sequence's KV cells must hold, and when a cached prefix can be
kept (issue 20, item 1). The positions are what llama.cpp's llama_memory_seq_pos_min/max
report: for a sliding-window model, its sliding-window cache's range, which llama.cpp keeps
contiguous (llama-kv-cache.cpp, apply_ubatch purges below any cell it reuses)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.kv_rules import Attention

FULL = Attention()
GEMMA3 = Attention(n_swa=512)  # the demo model: sliding window of 512
LLAMA4 = Attention(n_swa=8192, chunked=True)
MAMBA = Attention(recurrent=True)


def test_the_window_of_a_position_as_llama_cpp_masks_it() -> None:
    # is_masked_swa, standard: p0 is hidden from p1 when p1 - p0 >= n_swa.
    assert GEMMA3.lowest_needed(0) == 0
    assert GEMMA3.lowest_needed(511) == 0
    assert GEMMA3.lowest_needed(512) == 1
    assert GEMMA3.lowest_needed(1540) == 1029
    assert FULL.lowest_needed(1540) == 0
    # chunked: only the current chunk is seen.
    assert LLAMA4.lowest_needed(8191) == 0
    assert LLAMA4.lowest_needed(8192) == 8192
    assert LLAMA4.lowest_needed(9000) == 8192
    assert MAMBA.lowest_needed(10) == 9


def test_issue_20s_slot_cannot_lend_its_template_prefix() -> None:
    """The slot held 1,540 tokens with sliding-window cells from 211 up; the canary kept its
    4-token template prefix, whose cells were gone, and answered 'user\\nuser\\n...'."""
    assert not GEMMA3.keepable(4, 1540, pos_min=211)
    assert GEMMA3.keepable(4, 1540, pos_min=0)
    # All of it continues: the invariant vouches for the window of 1,540.
    assert GEMMA3.keepable(1540, 1540, pos_min=1029)
    assert GEMMA3.keepable(0, 1540, pos_min=1029)
    assert not GEMMA3.keepable(4, 1540, pos_min=-1)  # nothing held at all


def test_a_prefix_needs_cells_down_to_its_window_by_llama_servers_rule() -> None:
    # server-context.cpp: pos_min > max(0, n_past - n_swa) forces a full re-evaluation.
    assert GEMMA3.keepable(1000, 1540, pos_min=488)
    assert not GEMMA3.keepable(1000, 1540, pos_min=489)
    assert GEMMA3.keepable(300, 1540, pos_min=0)
    assert not GEMMA3.keepable(300, 1540, pos_min=1)


def test_plain_attention_keeps_any_prefix_of_a_whole_sequence() -> None:
    assert FULL.keepable(4, 1540, pos_min=0)
    assert not FULL.keepable(4, 1540, pos_min=3)  # never happens, unless cells were lost


def test_a_recurrent_memory_keeps_all_or_nothing() -> None:
    assert MAMBA.keepable(100, 100, pos_min=99)
    assert not MAMBA.keepable(99, 100, pos_min=99)
    assert MAMBA.keepable(0, 100, pos_min=99)


def test_agreement_and_each_way_to_disagree() -> None:
    assert GEMMA3.problem(0, -1, -1) is None
    assert GEMMA3.problem(1540, 211, 1539) is None  # sliding cells gone below the window: fine
    assert GEMMA3.problem(1540, 0, 1539) is None
    assert FULL.problem(10, 0, 9) is None
    # The books say empty, the cells say otherwise.
    assert "holds no tokens" in (GEMMA3.problem(0, 0, 3) or "")
    # Issue 20: 4 tokens kept, but their sliding-window cells were purged before the rm.
    assert "none of its positions" in (GEMMA3.problem(4, -1, -1) or "")
    # More, or fewer, cells than tokens.
    assert "last position is 12" in (FULL.problem(10, 0, 12) or "")
    assert "last position is 7" in (FULL.problem(10, 0, 7) or "")
    # The window of the next token is not all there.
    assert "from 1029" in (GEMMA3.problem(1540, 1030, 1539) or "")
    assert FULL.problem(10, 1, 9) is not None
    assert MAMBA.problem(10, 9, 9) is None
    assert MAMBA.problem(10, 8, 8) is not None


def test_a_chunk_boundary_may_leave_no_sliding_cells() -> None:
    assert LLAMA4.problem(8192, -1, -1) is None
    assert LLAMA4.problem(8193, -1, -1) is not None
    assert LLAMA4.problem(9000, 8192, 8999) is None
    assert LLAMA4.problem(9000, 8193, 8999) is not None


@given(
    n_swa=st.integers(1, 64),
    cached=st.integers(1, 300),
    data=st.data(),
)
def test_a_keepable_prefix_leaves_a_sequence_the_invariant_accepts(n_swa: int, cached: int, data: st.DataObject) -> None:
    """Model of llama.cpp's sliding-window cache: a sequence of `cached` tokens whose cells
    below some point have been given away (any point the window allowed). Keeping a prefix
    the rule allows, then removing the rest (llama_memory_seq_rm), must leave a sequence
    that decodes right, by the invariant's own standard; and every state llama.cpp can
    reach is one the invariant accepts."""
    att = Attention(n_swa=n_swa)

    def held(lost: int, n: int) -> tuple[int, int]:  # what the API reports
        return (lost, n - 1) if lost < n else (-1, -1)

    # llama.cpp gives away only cells hidden from the next position, lowest first.
    lost = data.draw(st.integers(0, min(att.lowest_needed(cached), cached)))
    assert att.problem(cached, *held(lost, cached)) is None
    keep = data.draw(st.integers(0, cached))
    if not att.keepable(keep, cached, held(lost, cached)[0]):
        return
    assert att.problem(keep, *held(lost, keep)) is None
