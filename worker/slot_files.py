"""llama-server's slot actions (POST /slots/{id}?action=save|restore|erase): a slot's
cached tokens and KV cells written to a file, read back into a slot, or dropped.

They keep the KV invariant (worker/kv_cache.py): a save reads both layers as they are; a
restore drops the slot's sequence, reads the cells and the tokens together, and sets the
slot's books to exactly those tokens, or leaves the slot empty when anything is off (the
cells must then span exactly the tokens read, as `check` demands each step); an erase
drops both. Each waits until its slot is idle, as llama-server's do: the engine offers
them every loop, between steps, so no decode is under way.

The file is llama.cpp's own (llama_state_seq_save_file): the token ids, then the
sequence's state. llama-server's newer files pack a header into the token list
(LLAMA_TOKEN_NULL, a version, a count) before the ids; a restore reads both kinds.
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Callable

import llama_cpp

from worker.kv_cache import KvCache
from worker.model import LoadedModel
from worker.protocol import Error, Frame, SlotFile, SlotFileResult
from worker.request import Request
from worker.slots import Slot

log = logging.getLogger("worker")

# llama-server's packed token state: LLAMA_TOKEN_NULL, its version, the token count.
_PACKED = -1


def unpacked(tokens: list[int]) -> list[int] | None:
    """The token ids of a file's token list, plain or in llama-server's packed form; None
    when the packed header does not add up."""
    if tokens[:1] != [_PACKED]:
        return tokens
    if len(tokens) < 3 or tokens[2] != len(tokens) - 3:
        return None
    return tokens[3:]


class SlotFiles:
    """The slot actions waiting for their slots; the engine thread runs everything here."""

    def __init__(
        self, m: LoadedModel, kv: KvCache, slots: list[Slot[Request]], n_ctx_slot: int, emit: Callable[[Frame], None]
    ) -> None:
        self.m, self.kv, self.slots, self.n_ctx_slot, self.emit = m, kv, slots, n_ctx_slot, emit
        self.pending: list[SlotFile] = []

    def add(self, frame: SlotFile) -> None:
        if not 0 <= frame.slot < len(self.slots):
            self.emit(Error(id=frame.id, code="invalid_request", message="Invalid slot ID", param="id_slot"))
            return
        self.pending.append(frame)

    def step(self) -> None:
        """Act on every waiting action whose slot is idle now, in arrival order."""
        waiting: list[SlotFile] = []
        for frame in self.pending:
            slot = self.slots[frame.slot]
            if not slot.idle:
                waiting.append(frame)
                continue
            try:
                self.emit(self._act(frame, slot))
            except Exception as exc:  # a bug costs this action, never the worker
                log.exception("slot action %s", frame.action)
                self.kv.drop(slot)
                self.emit(Error(id=frame.id, code="internal", message=f"slot {frame.action} failed: {exc}"))
        self.pending = waiting

    def _act(self, frame: SlotFile, slot: Slot[Request]) -> Frame:
        t0 = time.perf_counter()
        if frame.action == "erase":
            n = len(slot.cache)
            self.kv.drop(slot)
            return SlotFileResult(id=frame.id, slot=frame.slot, n_tokens=n)
        if frame.action == "save":
            tokens = (llama_cpp.llama_token * max(len(slot.cache), 1))(*slot.cache)
            n_bytes = int(
                llama_cpp.llama_state_seq_save_file(
                    self.m.ctx, frame.path.encode(), slot.seq_id, tokens, len(slot.cache)
                )
            )
            if n_bytes == 0:
                return Error(id=frame.id, code="internal", message="Unable to save slot")
            ms = (time.perf_counter() - t0) * 1000
            return SlotFileResult(id=frame.id, slot=frame.slot, n_tokens=len(slot.cache), n_bytes=n_bytes, ms=ms)
        return self._restore(frame, slot, t0)

    def _restore(self, frame: SlotFile, slot: Slot[Request], t0: float) -> Frame:
        self.kv.drop(slot)
        capacity = self.n_ctx_slot + 3  # room for llama-server's packed header
        tokens = (llama_cpp.llama_token * capacity)()
        count = ctypes.c_size_t(0)
        n_bytes = int(
            llama_cpp.llama_state_seq_load_file(
                self.m.ctx, frame.path.encode(), slot.seq_id, tokens, capacity, ctypes.byref(count)
            )
        )

        def refuse(why: str) -> Error:
            self.kv.drop(slot)
            return Error(id=frame.id, code="invalid_request", message=f"Unable to restore slot: {why}", param="filename")

        if n_bytes == 0:
            return refuse("No available space in KV cache or invalid slot save file")
        ids = unpacked(list(tokens[: count.value]))
        if ids is None or any(not 0 <= t < self.m.n_vocab for t in ids):
            return refuse("Invalid tokens in slot save file")
        if len(ids) > self.n_ctx_slot:
            return refuse("Restored prompt does not fit in the slot context")
        slot.cache[:] = ids
        pos_min, pos_max = self.kv.span(slot)
        if self.kv.attention.problem(len(ids), pos_min, pos_max) is not None:
            # The cells read do not span the tokens read (a file from another model or
            # context): never served from.
            return refuse("the saved cache does not match its tokens")
        ms = (time.perf_counter() - t0) * 1000
        return SlotFileResult(id=frame.id, slot=frame.slot, n_tokens=len(ids), n_bytes=n_bytes, ms=ms)
