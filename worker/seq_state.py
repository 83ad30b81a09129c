"""A sequence's KV cells as bytes, out of the context and back: llama.cpp's
`llama_state_seq_get_data` / `set_data`, which the prompt cache (worker/prompt_store.py)
keeps in host memory and on disk. The engine thread alone calls these: they read and write
the context."""

from __future__ import annotations

import ctypes

import llama_cpp


def read_state(ctx: llama_cpp.llama_context_p, seq_id: int) -> bytes:
    """Sequence `seq_id`'s cells, in llama.cpp's own format; empty when it has none."""
    size = int(llama_cpp.llama_state_seq_get_size(ctx, seq_id))
    if size <= 0:
        return b""
    buf = (ctypes.c_uint8 * size)()
    n = int(llama_cpp.llama_state_seq_get_data(ctx, buf, size, seq_id))
    return bytes(buf)[:n] if n > 0 else b""


def write_state(ctx: llama_cpp.llama_context_p, seq_id: int, data: bytes) -> bool:
    """Put saved cells into the empty sequence `seq_id`. False when llama.cpp refused them
    (no room in the KV cache, a state from another model or context): it then leaves the
    sequence as it found it, or partly written, which the caller drops."""
    if not data:
        return False
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    return int(llama_cpp.llama_state_seq_set_data(ctx, buf, len(data), seq_id)) > 0


def load_state(ctx: llama_cpp.llama_context_p, seq_id: int, state: memoryview) -> bool:
    """Put cells into the empty sequence `seq_id` from `state` (a writable buffer in
    llama_state_seq_set_data's format, read in place, not copied). True only when llama.cpp
    took them and read every byte: a state with bytes past its end is not the one it
    claims to be. On False the sequence may hold part of it, which the caller drops."""
    if len(state) == 0:
        return False
    buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
    return int(llama_cpp.llama_state_seq_set_data(ctx, buf, len(state), seq_id)) == len(state)
