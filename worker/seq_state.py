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
