"""The cells an attention KV cache's saved state holds, and their positions, read in Python.

llama.cpp's reader of a sequence's state checks its structure (stream and layer counts,
types, row sizes, a cell count that fits) but not its positions: a crafted file can put a
cell at position 2**31-1 or -1, which `llama_memory_seq_rm(seq, -1, -1)` never removes (its
range is [0, INT_MAX)). Such a cell stays in the shared cache whatever the slot's books say,
and from then on every batch holding that sequence fails to decode, for every key. So a
slot file's positions are read here first (worker/slot_file_format.py decides what they
must be).

The layout (llama-kv-cache.cpp: state_write, state_write_meta, state_write_data), one
section per cache (an iSWA model's full cache, then its sliding-window cache), native
byte order:

    u32 n_stream | per stream: u32 cell_count,
      cell_count x (i32 pos | u32 n_seq_id (1) | [12-byte cell ext] | i32 seq_id),
      u32 v_trans | u32 n_layer |
      n_layer x (i32 k_type | u64 k_row | k_row * cell_count bytes) |
      per layer with a V tensor:
        v_trans 0: i32 v_type | u64 v_row | v_row * cell_count bytes
        v_trans 1: i32 v_type | u32 v_el | u32 n_embd_v | v_el * n_embd_v * cell_count bytes

Whether cells carry the 12-byte ext (M-RoPE models) and whether layers have a V tensor (not
with MLA) is the model's, not the file's to say; both are tried, and the reading that
accounts for every byte is taken. Pure.
"""

from __future__ import annotations

import struct
from typing import Iterator

_EXT = (0, 12)  # llama_kv_cell_ext: x, y, tok
_MAX_LAYERS = 4096
_MAX_ROW = 1 << 26  # bytes of one cell's row in one layer: far above any model's


class _Short(Exception):
    """The bytes do not read as a state with this layout."""


class _Reader:
    def __init__(self, data: bytes | bytearray | memoryview, at: int = 0) -> None:
        self.data, self.at = data, at

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise _Short
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return int(value)

    def skip(self, n: int) -> None:
        if n < 0 or self.at + n > len(self.data):
            raise _Short
        self.at += n


def _cells(r: _Reader, count: int, ext: int) -> list[int]:
    # Each cell: its position, one sequence (as a sequence's state is saved), the ext, then
    # the sequence id (the reader puts its own).
    size = 12 + ext
    start = r.at
    r.skip(size * count)
    cells = struct.iter_unpack(f"<iI{ext + 4}x", r.data[start : r.at])
    positions = []
    for pos, n_seq in cells:
        if n_seq != 1:
            raise _Short
        positions.append(pos)
    return positions


def _data(r: _Reader, count: int, with_v: bool) -> None:
    v_trans, n_layer = r.take("<I"), r.take("<I")
    if v_trans > 1 or not 0 < n_layer <= _MAX_LAYERS:
        raise _Short
    for _ in range(n_layer):
        r.take("<i")
        row = r.take("<Q")
        if not 0 < row <= _MAX_ROW:
            raise _Short
        r.skip(row * count)
    if not with_v:
        return
    for _ in range(n_layer):
        r.take("<i")
        if v_trans:
            el, width = r.take("<I"), r.take("<I")
            if not 0 < el * width <= _MAX_ROW:
                raise _Short
            r.skip(el * width * count)
        else:
            row = r.take("<Q")
            if not 0 < row <= _MAX_ROW:
                raise _Short
            r.skip(row * count)


def _sections(data: bytes | bytearray | memoryview, at: int, ext: int, with_v: bool) -> Iterator[list[int]]:
    r = _Reader(data, at)
    while r.at < len(data):
        if r.take("<I") != 1:  # Corral's cache is unified: one stream
            raise _Short
        count = r.take("<I")
        if count == 0:
            yield []
            continue
        positions = _cells(r, count, ext)
        _data(r, count, with_v)
        yield positions


def cell_positions(data: bytes | bytearray | memoryview, at: int) -> list[list[int]] | None:
    """Each cache's cell positions, in the order saved, of the attention KV state that
    begins at byte `at` of `data` and runs to its end; None when no reading accounts for
    every byte (a state cut short, crafted, or of another kind of memory)."""
    for ext in _EXT:
        for with_v in (True, False):
            try:
                caches = list(_sections(data, at, ext, with_v))
            except _Short:
                continue
            if caches:
                return caches
    return None
