"""Which positions each of a sequence's KV caches holds, read from llama.cpp's own state
serialization: the only view of the full-attention cache of a sliding-window model, whose
range llama_memory_seq_pos_min/max do not report (they report the sliding-window cache's).

`llama_state_seq_get_data_ext(ctx, buf, size, seq, 0)` writes, after a magic number and the
sequence id, each cache in turn (an iSWA memory: the full-attention one, then the
sliding-window one), each as llama_kv_cache::state_write lays it out in the llama.cpp that
llama-cpp-python 0.3.36 vendors (src/llama-kv-cache.cpp): the stream count; per stream the
cell count, then per cell its position, sequence-id count (and ids), then the keys and
values per layer. A sliding-window cache leaves out cells hidden from the sequence's last
position. Anything that does not parse exactly is an AssertionError: a changed format must
fail the test that reads it, not pass it.

Copying the state copies the cells' keys and values too, so this is for tests only.
"""

from __future__ import annotations

import ctypes
import struct

import llama_cpp

IO_MAGIC = 0xAF143CD8


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> tuple[int, ...]:
        size = struct.calcsize(fmt)
        assert self.at + size <= len(self.data), "the KV state ended early"
        out = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return out

    def skip(self, n: int) -> None:
        assert n >= 0 and self.at + n <= len(self.data), "the KV state ended early"
        self.at += n

    @property
    def done(self) -> bool:
        return self.at == len(self.data)


def _one_cache(r: _Reader, seq: int, ext: bool) -> list[int]:
    (n_stream,) = r.take("<I")
    positions: list[int] = []
    for _ in range(n_stream):
        (cells,) = r.take("<I")
        if cells == 0:
            continue
        for _ in range(cells):
            pos, n_seq = r.take("<iI")
            assert n_seq == 1, f"a cell of sequence {seq} lists {n_seq} sequences"
            if ext:  # an M-RoPE model's cells: llama_kv_cell_ext (x, y, tok)
                r.skip(12)
            (sid,) = r.take("<i")
            assert sid == seq, f"a cell of sequence {seq} names sequence {sid}"
            positions.append(pos)
        v_trans, n_layer = r.take("<II")
        for _ in range(n_layer):  # keys: type, row size, one row per cell
            _k_type, row = r.take("<iQ")
            r.skip(row * cells)
        for _ in range(n_layer):  # values (every layer of these models has them)
            if v_trans:
                _v_type, size_el, n_embd = r.take("<iII")
                r.skip(size_el * n_embd * cells)
            else:
                _v_type, row = r.take("<iQ")
                r.skip(row * cells)
    return positions


def cache_positions(ctx: llama_cpp.llama_context_p, seq: int, ext: bool = False) -> list[list[int]]:
    """For each of the memory's KV caches in turn, the positions it holds for `seq`, in
    order (a position held twice appears twice). `ext`: the cells carry llama.cpp's
    llama_kv_cell_ext (has_cell_ext(): an M-RoPE model). Call only while nothing else uses
    the context."""
    size = int(llama_cpp.llama_state_seq_get_size_ext(ctx, seq, 0))
    buf = (ctypes.c_uint8 * size)()
    written = int(llama_cpp.llama_state_seq_get_data_ext(ctx, buf, size, seq, 0))
    assert written == size, f"llama.cpp wrote {written} of {size} bytes of sequence {seq}'s state"
    r = _Reader(bytes(buf))
    magic, sid = r.take("<Ii")
    assert (magic, sid) == (IO_MAGIC, seq), "not a sequence state of this llama.cpp"
    caches = []
    while not r.done:
        # Cells come in the cache's own order, which is not the positions' order.
        caches.append(sorted(_one_cache(r, seq, ext)))
    return caches
