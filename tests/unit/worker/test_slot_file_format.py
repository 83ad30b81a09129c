"""worker/slot_file_format.py: a slot file's header and token list checked in Python before
any byte of it reaches llama.cpp (issue 40: half of a valid save aborted the worker in
llama.cpp's own reader)."""

from __future__ import annotations

import array
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.slot_file_format import (
    BUFFER_HEADER, GGSQ, IO_MAGIC, VERSION, BadSlotFile, as_state_buffer, file_header, parse, state_of, unpacked,
)

N_VOCAB = 1000
N_CTX_SLOT = 64
def cache(positions: list[int], streams: int = 1, ext: int = 0, with_v: bool = True, layers: int = 2, row: int = 8) -> bytes:
    """One attention cache's saved state, laid out as llama.cpp writes it
    (worker/slot_state_layout.py): stream and cell counts, each cell's position, its one
    sequence, the ext and the sequence id, then each layer's K rows, then V's."""
    out = struct.pack("<II", streams, len(positions))
    for p in positions:
        out += struct.pack("<iI", p, 1) + b"\x00" * ext + struct.pack("<i", 0)
    if positions:
        out += struct.pack("<II", 0, layers)
        for _ in range(layers * (2 if with_v else 1)):
            out += struct.pack("<iQ", 1, row) + b"\x07" * (row * len(positions))
    return out


def state(cells: int, streams: int = 1) -> bytes:
    """A full attention cache holding cells 0 .. cells-1."""
    return cache(list(range(cells)), streams)


def _file(tokens: list[int], state_: bytes | None = None, version: int = VERSION, count: int | None = None) -> bytearray:
    n = len(tokens) if count is None else count
    body = state(len(tokens)) if state_ is None else state_
    return bytearray(struct.pack("<III", GGSQ, version, n) + array.array("i", tokens).tobytes() + body)


def test_a_whole_file_gives_its_tokens_and_where_its_cells_begin() -> None:
    data = _file([5, 6, 7])
    parsed = parse(data, N_VOCAB, N_CTX_SLOT)
    assert parsed.tokens == [5, 6, 7] and bytes(data[parsed.state_at :]) == state(3)
    assert parse(_file([-1, 1, 2, 8, 9], state(2)), N_VOCAB, N_CTX_SLOT).tokens == [8, 9]  # llama-server's packed list


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "too short"),
        (b"ggsq", "too short"),
        (struct.pack("<III", 0x12345678, VERSION, 0) + state(0), "not a llama.cpp slot file"),
        (bytes(_file([1], version=2)), "version 2"),
        (bytes(_file([1] * (N_CTX_SLOT + 4))), "more than the slot's context"),
        (bytes(_file([1, 2, 3], count=3_000_000_000)), "more than the slot's context"),
        (bytes(_file([1, 2, 3], b"")), "cut short"),
        (bytes(_file([1, 2, 3], b"", count=40)), "cut short"),
        (bytes(_file([1, 2, 3], state(3, streams=2))), "cut short, or is not"),
        (bytes(_file([1, 2, 3], state(4))), "positions are not those of its 3 tokens"),
        (bytes(_file([1, 2, 3], state(2))), "positions are not those of its 3 tokens"),
        (bytes(_file([1, 2, 3], state(3)[:4] + struct.pack("<I", 0xFFFFFFFF) + state(3)[8:])), "cut short"),
        (bytes(_file([1, 2, 3], cache([0, 1, 2**31 - 1]))), "positions"),  # issue 40: a cell seq_rm never removes
        (bytes(_file([1, 2, 3], cache([0, -1, 2]))), "positions"),
        (bytes(_file([1, 2, 3], cache([0, 1, 1]))), "positions"),
        (bytes(_file([1, 2, 3], state(3) + state(3) + state(3))), "3 caches"),
        (bytes(_file([-1, 1, 9, 5])), "packed token header"),
        (bytes(_file([1, N_VOCAB])), "vocabulary"),
        (bytes(_file([1, -7])), "vocabulary"),
    ],
)
def test_a_file_that_is_not_whole_or_not_for_this_model_is_refused_with_why(data: bytes, why: str) -> None:
    with pytest.raises(BadSlotFile, match=why):
        parse(bytearray(data), N_VOCAB, N_CTX_SLOT)


def test_every_cut_of_a_file_is_refused() -> None:
    # Issue 40's crash: half of a valid save. Its layout is read whole before llama.cpp
    # sees a byte, so any cut short of the end, and anything after it, is refused.
    data = _file(list(range(20)))
    # A cut right after the K rows reads as a model whose layers have no V tensor (MLA):
    # the only cut read whole, whose missing V rows llama.cpp's bounded reader refuses.
    k_rows_end = len(data) - 2 * (12 + 8 * 20)
    assert parse(data, N_VOCAB, N_CTX_SLOT).tokens == list(range(20))
    for cut in range(len(data)):
        if cut == k_rows_end:
            continue
        with pytest.raises(BadSlotFile):
            parse(data[:cut], N_VOCAB, N_CTX_SLOT)
    with pytest.raises(BadSlotFile):
        parse(data + b"\x00", N_VOCAB, N_CTX_SLOT)
    whole_k = _file(list(range(20)), cache(list(range(20)), with_v=False))
    for cut in range(len(whole_k)):
        with pytest.raises(BadSlotFile):
            parse(whole_k[:cut], N_VOCAB, N_CTX_SLOT)


def test_the_cells_a_state_holds_are_held_to_its_tokens_as_the_models_memory_keeps_them() -> None:
    tokens = [1, 2, 3, 4]
    # iSWA (gemma-3): the full cache holds every position, the window's the last ones, in
    # any cell order; with M-RoPE's 12-byte cell ext, or without V tensors (MLA), too.
    for body in (
        cache([0, 1, 2, 3]) + cache([3, 2]), cache([2, 0, 3, 1], ext=12) + cache([2, 3], ext=12),
        cache([0, 1, 2, 3], with_v=False) + cache([3], with_v=False), cache([2, 3]),
    ):
        assert parse(_file(tokens, body), N_VOCAB, N_CTX_SLOT, windowed=True).tokens == tokens
    for body in (
        cache([0, 1, 2]) + cache([2, 3]),  # the full cache misses position 3
        cache([0, 1, 2, 3]) + cache([1, 3]),  # the window's cells are no run up to the last
        cache([0, 1, 2, 3]) + cache([3, 4]),
        cache([0, 1, 2, 3]) + cache([]),
    ):
        with pytest.raises(BadSlotFile, match="positions"):
            parse(_file(tokens, body), N_VOCAB, N_CTX_SLOT, windowed=True)
    with pytest.raises(BadSlotFile, match="caches"):
        parse(_file(tokens, cache([0, 1, 2, 3]) + cache([3])), N_VOCAB, N_CTX_SLOT, windowed=False)
    # A recurrent memory's state has another layout: not looked into.
    assert parse(_file([1, 2, 3], b"\xff" * 12), N_VOCAB, N_CTX_SLOT, windowed=None).tokens == [1, 2, 3]


@settings(max_examples=300)
@given(st.binary(max_size=200), st.integers(0, 40))
def test_no_bytes_raise_anything_but_a_refusal(tail: bytes, n: int) -> None:
    for data in (bytearray(tail), _file(list(range(n)), tail), bytearray(struct.pack("<II", GGSQ, VERSION) + tail)):
        try:
            parsed = parse(data, N_VOCAB, N_CTX_SLOT)
        except BadSlotFile:
            continue
        assert all(0 <= t < N_VOCAB for t in parsed.tokens) and len(parsed.tokens) <= N_CTX_SLOT
        assert parsed.state_at + BUFFER_HEADER <= len(data)


def test_the_cells_are_handed_over_in_place_behind_llama_cpps_buffer_header() -> None:
    data = _file([5, 6, 7])
    parsed = parse(data, N_VOCAB, N_CTX_SLOT)
    view = as_state_buffer(data, parsed, seq_id=3)
    assert bytes(view) == struct.pack("<Ii", IO_MAGIC, 3) + state(3)
    view.release()


def test_a_saved_file_is_the_header_the_tokens_and_the_state_after_llama_cpps_buffer_header() -> None:
    buffer = struct.pack("<Ii", IO_MAGIC, 2) + state(3)
    written = file_header([5, 6, 7]) + bytes(state_of(buffer))
    assert written == bytes(_file([5, 6, 7]))
    with pytest.raises(BadSlotFile):
        state_of(b"\x00" * 16)


def test_both_token_layouts_unpack() -> None:
    assert unpacked([5, 6, 7]) == [5, 6, 7]
    assert unpacked([-1, 1, 3, 5, 6, 7]) == [5, 6, 7]
    assert unpacked([-1, 1, 9, 5]) is None


def test_a_window_cell_at_the_lowest_position_is_refused_at_once() -> None:
    # Found by this change's own e2e test: checking a run of positions from -2**31 up
    # built a list of 2**31 numbers and the worker ran out of memory.
    body = cache([0, 1, 2, 3]) + cache([-(2**31), 3])
    with pytest.raises(BadSlotFile, match="positions"):
        parse(_file([1, 2, 3, 4], body), N_VOCAB, N_CTX_SLOT, windowed=True)
