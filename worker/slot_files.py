"""llama-server's slot actions (POST /slots/{id}?action=save|restore|erase): a slot's
cached tokens and KV cells written to a file, read back into a slot, or dropped.

They keep the KV invariant (worker/kv_cache.py): a save reads both layers as they are; a
restore parks what the slot held (as a request taking the slot would: worker/kv_entries.py),
reads the cells and the tokens together into its emptied sequence, and sets the slot's
books to exactly those tokens, or leaves the slot empty when anything is off (the cells
must then span exactly the tokens read, as `check` demands each step); an erase drops both. Each waits until its slot is idle, as llama-server's do: the engine offers
them every loop, between steps, so no decode is under way.

The file is llama.cpp's own (worker/slot_file_format.py), but read and written here, never
by llama.cpp's file functions: a restore checks the header and the tokens, then hands the
cells to llama.cpp's in-memory reader, which cannot be made to abort; the folder's rules
(no links followed, whole files only, a bound) are worker/slot_folder.py's.

Cells belong to a cache scope (router/server/cache_scope.py): a restored slot's become the
caller's. Where the caller may act only on its own (`own_only`: an ordinary key, when keys
may use slot actions), a slot holding another scope's cells is not its to save (a 400) and,
to erase, an empty slot: nothing is erased, and nothing is said of what it held.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from worker import slot_folder
from worker.kv_cache import KvCache
from worker.kv_entries import Entries
from worker.model import LoadedModel
from worker.adapter_turns import owner_scope
from worker.protocol import Error, ErrorCode, Frame, SlotFile, SlotFileResult
from worker.request import Request
from worker.seq_state import load_state, read_state
from worker.slot_file_format import BadSlotFile, as_state_buffer, file_header, parse, state_of
from worker.slot_folder import FolderError
from worker.slots import Slot

log = logging.getLogger("worker")


class SlotFiles:
    """The slot actions waiting for their slots; the engine thread runs everything here."""

    def __init__(
        self, m: LoadedModel, kv: KvCache, entries: Entries[Request], slots: list[Slot[Request]], n_ctx_slot: int,
        emit: Callable[[Frame], None], images: bool = False,
    ) -> None:
        self.m, self.kv, self.entries, self.slots, self.n_ctx_slot, self.emit = m, kv, entries, slots, n_ctx_slot, emit
        self.images = images  # a projector's model: files may hold images' ids (worker/media/spans.py)
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
        # To a caller limited to its own cells, another scope's slot is an empty one.
        foreign = frame.own_only and bool(slot.cache) and owner_scope(slot.scope) != frame.cache_scope
        if frame.action == "erase":
            n = 0 if foreign else len(slot.cache)
            if not foreign:
                self.kv.drop(slot)
            return SlotFileResult(id=frame.id, slot=frame.slot, n_tokens=n)
        if self.kv.attention.mrope:
            # Its cells carry a 2-D position each, which the file checks here do not read
            # (worker/slot_state_layout.py): no file of one is written or trusted.
            return Error(id=frame.id, code="unsupported", param="id_slot", message=(
                f"Unable to {frame.action} slot: slot files are not served for M-RoPE models (the Qwen2-VL family)"
            ))
        if frame.action == "save":
            if foreign:
                return Error(
                    id=frame.id, code="invalid_request", param="id_slot",
                    message=f"Unable to save slot: slot {frame.slot} holds no cache of this key's",
                )
            if slot.scope != owner_scope(slot.scope):
                # A slot file holds tokens and cells, not the adapters they were decoded
                # under: restored, they would pass for the base model's.
                return Error(id=frame.id, code="unsupported", param="id_slot", message=(
                    f"Unable to save slot: slot {frame.slot} holds cells decoded under LoRA adapters, which a slot file cannot record"
                ))
            return self._save(frame, slot, t0)
        return self._restore(frame, slot, t0)

    def _save(self, frame: SlotFile, slot: Slot[Request], t0: float) -> Frame:
        tokens = list(slot.cache)
        try:
            state = state_of(read_state(self.m.ctx, slot.seq_id))
            head = file_header(tokens)
            slot_folder.write(
                frame.folder, frame.filename, (head, state), len(head) + len(state), frame.folder_max_bytes, frame.bound_root
            )
        except (FolderError, BadSlotFile) as exc:
            log.warning("slot %d: save to %r refused: %s", frame.slot, frame.filename, exc)
            code: ErrorCode = "internal"
            if isinstance(exc, FolderError) and exc.full:
                code = "insufficient_storage"
            elif isinstance(exc, FolderError) and not exc.server:
                code = "invalid_request"
            return Error(
                id=frame.id, code=code, message=f"Unable to save slot: {exc}",
                param=None if code == "internal" else "filename",
            )
        ms = (time.perf_counter() - t0) * 1000
        return SlotFileResult(id=frame.id, slot=frame.slot, n_tokens=len(tokens), n_bytes=len(head) + len(state), ms=ms)

    def _restore(self, frame: SlotFile, slot: Slot[Request], t0: float) -> Frame:
        # What the slot held stays in the cache for its own scope's next prompt, as when a
        # request takes the slot; with no room for an entry it is dropped, as then.
        if not slot.cache or self.entries.park(slot, slot.last_used) is None:
            self.kv.drop(slot)
        try:
            data = slot_folder.read(frame.folder, frame.filename, frame.folder_max_bytes)
            att = self.kv.attention
            parsed = parse(
                data, self.m.n_vocab, self.n_ctx_slot, None if att.recurrent else att.n_swa > 0, self.images
            )
        except (FolderError, BadSlotFile) as exc:
            log.warning("slot %d: restore from %r refused: %s", frame.slot, frame.filename, exc)
            return self._refused(frame, str(exc))
        state = as_state_buffer(data, parsed, slot.seq_id)
        restored = self.kv.restore(slot, parsed.tokens, lambda seq: load_state(self.m.ctx, seq, state), frame.cache_scope)
        state.release()
        if not restored:
            # llama.cpp refused the cells (another model or context, no room, a crafted
            # state), or they do not span the tokens read: the slot stays empty.
            return self._refused(frame, "No available space in KV cache or invalid slot save file")
        ms = (time.perf_counter() - t0) * 1000
        return SlotFileResult(id=frame.id, slot=frame.slot, n_tokens=len(parsed.tokens), n_bytes=len(data), ms=ms)

    def _refused(self, frame: SlotFile, why: str) -> Error:
        self.kv.drop(self.slots[frame.slot])
        return Error(id=frame.id, code="invalid_request", message=f"Unable to restore slot: {why}", param="filename")

