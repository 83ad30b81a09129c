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
CELLS = b"\x07" * 40


def state(cells: int, streams: int = 1) -> bytes:
    """An attention cache's state: its stream count, its cell count, then the cells."""
    return struct.pack("<II", streams, cells) + CELLS


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
        (bytes(_file([1, 2, 3], state(3, streams=2))), "2 KV streams"),
        (bytes(_file([1, 2, 3], state(4))), "4 cells for its 3 tokens"),
        (bytes(_file([1, 2, 3], state(2))), "2 cells for its 3 tokens"),
        (bytes(_file([1, 2, 3], state(0xFFFFFFFF))), "cells for its 3 tokens"),
        (bytes(_file([-1, 1, 9, 5])), "packed token header"),
        (bytes(_file([1, N_VOCAB])), "vocabulary"),
        (bytes(_file([1, -7])), "vocabulary"),
    ],
)
def test_a_file_that_is_not_whole_or_not_for_this_model_is_refused_with_why(data: bytes, why: str) -> None:
    with pytest.raises(BadSlotFile, match=why):
        parse(bytearray(data), N_VOCAB, N_CTX_SLOT)


def test_every_cut_of_a_file_is_refused_or_keeps_its_tokens_whole() -> None:
    # Issue 40's crash: half of a valid save. A cut inside the header or the token list is
    # refused here; one inside the cells is left to llama.cpp's in-memory reader, which
    # bounds each read by the buffer (tested on the real model in tests/e2e).
    data = _file(list(range(20)))
    for cut in range(len(data)):
        try:
            parsed = parse(data[:cut], N_VOCAB, N_CTX_SLOT)
        except BadSlotFile:
            assert cut < 12 + 4 * 20 + BUFFER_HEADER
            continue
        assert parsed.tokens == list(range(20)) and parsed.state_at == 12 + 80


def test_the_cells_a_state_claims_are_held_to_its_tokens_as_the_models_memory_keeps_them() -> None:
    few = _file([1, 2, 3], state(2))
    assert parse(few, N_VOCAB, N_CTX_SLOT, windowed=True).tokens == [1, 2, 3]  # a window keeps fewer
    with pytest.raises(BadSlotFile):
        parse(_file([1, 2, 3], state(4)), N_VOCAB, N_CTX_SLOT, windowed=True)
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
