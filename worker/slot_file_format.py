"""llama.cpp's sequence state file (llama_state_seq_save_file), read and written in Python.

A slot file is whatever lies in the slot folder under the name a client sent: written by
this server, by llama-server, cut short by a full disk, or made by hand to hurt. llama.cpp's
own reader trusts it: its file reader returns short reads as if they were whole, and its
loader then aborts the process (`GGML_ASSERT(nread <= state_size)`, llama-context.cpp),
taking every other request on the model with it. So no byte of a file reaches llama.cpp
until it has been read and checked here, and the cells go in through the in-memory reader
(llama_state_seq_set_data), which bounds every read by the buffer it was given and refuses
a state that does not fit this context (layer count, types and row sizes, cell count)
without harm.

The layout (llama-context.cpp, state_seq_save_file), native byte order:

    u32 magic 'ggsq' | u32 version (3) | u32 n_tokens | i32 tokens[n_tokens] | state

where `state` is what llama_state_seq_get_data writes after its own 8-byte header (u32
io_magic, i32 seq_id). llama-server's newer files pack a header into the token list
(LLAMA_TOKEN_NULL, a version, a count) before the ids; both kinds are read.

Pure: bytes in, bytes or a refusal out.
"""

from __future__ import annotations

import array
import struct
from dataclasses import dataclass

from worker.media.spans import is_placeholder
from worker.slot_state_layout import cell_positions

GGSQ = 0x67677371  # LLAMA_FILE_MAGIC_GGSQ
VERSION = 3  # LLAMA_STATE_SEQ_VERSION of this llama.cpp
IO_MAGIC = 0xAF143CD8  # the header of a llama_state_seq_get_data buffer (llama-context.cpp)
HEADER = 12  # magic, version, token count
BUFFER_HEADER = 8  # io_magic, seq_id
PACKED = -1  # LLAMA_TOKEN_NULL: llama-server's packed token list
PACKED_EXTRA = 3  # its header: the null token, a version, the count


class BadSlotFile(ValueError):
    """Why a file is not one this slot can restore (said to the client as a 400)."""


@dataclass(frozen=True)
class Parsed:
    tokens: list[int]  # the token ids, unpacked
    state_at: int  # where the state begins in the file


def unpacked(tokens: list[int]) -> list[int] | None:
    """The token ids of a file's token list, plain or in llama-server's packed form; None
    when the packed header does not add up."""
    if tokens[:1] != [PACKED]:
        return tokens
    if len(tokens) < PACKED_EXTRA or tokens[2] != len(tokens) - PACKED_EXTRA:
        return None
    return tokens[PACKED_EXTRA:]


def parse(
    data: bytes | bytearray, n_vocab: int, n_ctx_slot: int, windowed: bool | None = False, images: bool = False
) -> Parsed:
    """Check a file's header and token list against this model and slot, and the cells its
    state holds against its tokens: their positions must be exactly the tokens' (a
    sliding window's cache: the last of them), or the file is refused. Raises BadSlotFile.
    The cells' contents and the rest of their structure (layer types and row sizes) are
    checked by llama.cpp's in-memory reader.

    `windowed`: the model's attention has a sliding window (gemma-2/3 and others), so a
    cache may hold only the window's cells; None: a recurrent or hybrid memory, whose state
    has another layout and is left to llama.cpp. `images`: the model has a projector, and
    the ids of images' positions (worker/media/spans.py) are ids of this slot too."""
    if len(data) < HEADER:
        raise BadSlotFile("the file is too short to be a slot file")
    magic, version, n = struct.unpack_from("<III", data)
    if magic != GGSQ:
        raise BadSlotFile("not a llama.cpp slot file")
    if version != VERSION:
        raise BadSlotFile(f"a slot file of version {version}; this server reads version {VERSION}")
    if n > n_ctx_slot + PACKED_EXTRA:
        raise BadSlotFile(f"the file holds {n} tokens, more than the slot's context ({n_ctx_slot})")
    state_at = HEADER + 4 * n
    if state_at + BUFFER_HEADER > len(data):  # its state is at least a stream count and a cell count
        raise BadSlotFile("the file is cut short")
    listed = array.array("i")
    listed.frombytes(bytes(data[HEADER:state_at]))
    ids = unpacked(listed.tolist())
    if ids is None:
        raise BadSlotFile("its packed token header does not add up")
    if len(ids) > n_ctx_slot:
        raise BadSlotFile(f"the file holds {len(ids)} tokens, more than the slot's context ({n_ctx_slot})")
    if any(not 0 <= t < n_vocab and not (images and is_placeholder(t)) for t in ids):
        raise BadSlotFile("it holds token ids outside this model's vocabulary")
    if windowed is not None:
        _check_cells(data, state_at, len(ids), windowed)
    return Parsed(ids, state_at)


def _check_cells(data: bytes | bytearray, state_at: int, n: int, windowed: bool) -> None:
    """The positions of each cache's cells against the file's `n` tokens: a full cache
    holds 0 .. n-1, a sliding window's a run of them ending at n-1 (an iSWA model saves its
    full cache, then its window's). A position outside them would stay in the shared KV
    cache for good (worker/slot_state_layout.py)."""
    caches = cell_positions(data, state_at)
    if caches is None:
        raise BadSlotFile("its state is cut short, or is not this server's KV cache layout")
    if len(caches) > (2 if windowed else 1):
        raise BadSlotFile(f"its state holds {len(caches)} caches; this model keeps {2 if windowed else 1}")
    for i, positions in enumerate(caches):
        full = not windowed or (len(caches) == 2 and i == 0)
        low = 0 if full or not positions else min(positions)
        # The count first: a crafted position of -2**31 must not make a list of 2**31.
        if len(positions) != n - low or sorted(positions) != list(range(low, n)):
            raise BadSlotFile(f"its cells' positions are not those of its {n} tokens")


def as_state_buffer(data: bytearray, parsed: Parsed, seq_id: int) -> memoryview:
    """The file's cells as llama_state_seq_set_data reads them: its 8-byte header written
    over the end of the token list (read already), so that the cells are not copied."""
    at = parsed.state_at - BUFFER_HEADER  # >= HEADER - BUFFER_HEADER: always in the file
    struct.pack_into("<Ii", data, at, IO_MAGIC, seq_id)
    return memoryview(data)[at:]


def file_header(tokens: list[int]) -> bytes:
    """What a file holds before its state: the header and the token ids."""
    return struct.pack("<III", GGSQ, VERSION, len(tokens)) + array.array("i", tokens).tobytes()


def state_of(buffer: bytes) -> memoryview:
    """The state part of a llama_state_seq_get_data buffer (after its 8-byte header), as a
    file holds it. Raises BadSlotFile for a buffer llama.cpp did not write."""
    if len(buffer) < BUFFER_HEADER or struct.unpack_from("<I", buffer)[0] != IO_MAGIC:
        raise BadSlotFile("llama.cpp gave no state for the slot")
    return memoryview(buffer)[BUFFER_HEADER:]
