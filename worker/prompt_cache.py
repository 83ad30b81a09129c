"""The tiers of a model's prompt cache, moved between by the engine thread: the KV cache's
parked entries (worker/kv_entries.py), saved prompts in host memory, and files on disk
(worker/prompt_store.py).

- An entry the KV cache gives up is saved to host memory first (`spill`), and so is one
  left unused for a while (`step`): its cells slow every decode step while they are there.
- A prompt that a saved one serves better than anything in the KV cache has it written
  back as a parked entry before admission chooses (`promote`), so that the ordinary choice
  (worker/prefix_reuse.py) takes it.
- At a clean stop the hottest prompts, those in the KV cache and those in host memory, are
  written to disk (`persist`); at load they are read back, the hottest into the KV cache
  as parked entries, the rest into host memory (`load`).

Every restore goes through KvCache.restore, which sets a sequence's books only when the
cells read span exactly its tokens; the engine's invariant check covers the entry from then
on, as it covers every sequence.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import llama_cpp

from worker.kv_cache import KvCache
from worker.kv_entries import Entries
from worker.prefix_reuse import FOLLOW_MIN, idle_to_spill
from worker.prompt_store import DiskStore, HostCache, Saved, best_saved
from worker.request import Request
from worker.seq_state import read_state, write_state
from worker.slots import Slot, reusable_prefix

log = logging.getLogger("worker.cache")

# How often (decode steps) idle parked entries are looked at: the look compares prefixes
# (256 tokens of each sequence per candidate, some µs).
SPILL_CHECK = 16


@dataclass(frozen=True)
class CacheOptions:
    ram_bytes: int  # host memory for saved prompts
    folder: Path | None = None  # where they outlive the worker; None: nowhere
    disk_bytes: int = 0
    fingerprint: str = ""  # worker/prompt_store.py, fingerprint
    persist_seconds: float = 8.0  # what a clean stop may spend writing


class PromptCache:
    def __init__(self, ctx: llama_cpp.llama_context_p, kv: KvCache, entries: Entries[Request], options: CacheOptions) -> None:
        self.ctx, self.kv, self.entries, self.options = ctx, kv, entries, options
        self.host = HostCache(options.ram_bytes)
        self.disk = DiskStore(options.folder, options.fingerprint, options.disk_bytes) if options.folder else None
        # Only a sequence's last cells are kept by a sliding-window or recurrent memory, so a
        # saved prompt serves only a prompt that continues it.
        att = kv.attention
        self.whole_only = att.n_swa > 0 or att.recurrent
        # What /metrics shows: restores from host memory and from disk, and the prompt
        # tokens they saved decoding.
        self.restored = 0
        self.restore_failed = 0
        self.tokens_restored = 0
        self.loaded_from_disk = 0
        self.spilled_idle = 0  # entries moved to host memory for being idle (`step`)
        self._steps = 0

    # ---- between the KV cache and host memory --------------------------------------------------

    def set_ram_bytes(self, n: int) -> None:
        """The host memory budget changed (the supervisor's share of prompt_cache_budget)."""
        self.options = replace(self.options, ram_bytes=n)
        self.host.resize(n)

    def spill(self, seq: Slot[Request], used: int) -> None:
        """`seq`'s cells are about to be dropped: keep them in host memory."""
        if not seq.cache or self.options.ram_bytes <= 0:
            return
        data = read_state(self.ctx, seq.seq_id)
        if data:
            self.host.put(Saved(tokens=list(seq.cache), data=data, used=used, scope=seq.scope))

    def step(self, slots: Sequence[Slot[Request]], n: int = 1) -> None:
        """`n` decode steps went by. Every SPILL_CHECK steps, the parked entry idle longest
        moves to host memory if it has waited long enough (prefix_reuse.idle_to_spill):
        one at a time, so that saving it holds up the streams for one entry's copy at most.
        Without host memory nothing moves: an entry is worth its cells more than nothing."""
        checks = (self._steps + n) // SPILL_CHECK - self._steps // SPILL_CHECK
        self._steps += n
        if not checks or self.options.ram_bytes <= 0 or not self.entries.parked:
            return
        self.entries.age(SPILL_CHECK * checks)
        entry = idle_to_spill(self.entries.parked, slots)
        if entry is not None:
            self.entries.evict(entry)  # saved to host memory first (Entries.on_evict)
            self.spilled_idle += 1

    def promote(self, prompt: Sequence[int], sequences: Sequence[Slot[Request]], clock: int, scope: str = "") -> bool:
        """Write back the saved prompt of cache scope `scope` that serves `prompt` best, as a
        parked entry, when it gives FOLLOW_MIN more tokens than every sequence of that scope
        in the KV cache can."""
        if not self.host.entries or not self.entries.capacity:
            return False
        mine = (s for s in sequences if s.scope == scope)
        have = max((self.kv.usable(s, reusable_prefix(s.cache, prompt)) for s in mine), default=0)
        saved = [s for s in self.host.entries if s.scope == scope]
        found = best_saved(saved, prompt, have + FOLLOW_MIN - 1, self.whole_only)
        if found is None:
            return False
        item, n = found
        # Out of host memory first: making room for the entry may spill another one there.
        self.host.take(item)
        if self._restore(item, clock) is None:
            self.host.put(item)
            return False
        self.tokens_restored += n
        return True

    def _restore(self, item: Saved, clock: int) -> Slot[Request] | None:
        entry = self.entries.new_entry(clock)
        if entry is None:
            return None
        if not self.kv.restore(entry, item.tokens, lambda seq: write_state(self.ctx, seq, item.data), item.scope):
            self.entries.forget(entry)
            self.restore_failed += 1
            return None
        self.restored += 1
        return entry

    # ---- between the worker's runs -----------------------------------------------------------

    def load(self) -> int:
        """Read the model's saved prompts back: the hottest into the KV cache as parked
        entries, the others into host memory. Returns the admission clock to go on from."""
        if self.disk is None:
            return 0
        t0 = time.perf_counter()
        items = self.disk.load(limit=self.options.disk_bytes)
        clock = max((i.used for i in items), default=0)
        into_kv = 0
        for item in items:  # most recently used first
            if self.entries.free and self._restore(item, item.used) is not None:
                into_kv += 1
            else:
                self.host.put(item)
        self.loaded_from_disk = len(items)
        if items:
            log.info(
                "prompt cache: %d saved prompts read back in %.2f s (%d into the KV cache)",
                len(items), time.perf_counter() - t0, into_kv,
            )
        return clock + 1

    def persist(self, slots: Sequence[Slot[Request]], clock: int) -> None:
        """Write the hottest prompts to disk: what the KV cache holds (idle slots, parked
        entries), then what host memory holds, most recently used first."""
        if self.disk is None:
            return
        t0 = time.perf_counter()
        deadline = t0 + self.options.persist_seconds
        in_kv = [s for s in (*slots, *self.entries.parked) if s.idle and s.cache and not s.anchor]
        anchors = [e for e in self.entries.parked if e.anchor]
        candidates: list[tuple[int, Slot[Request] | Saved]] = [(s.last_used, s) for s in in_kv]
        candidates += [(s.used, s) for s in self.host.entries]
        candidates.sort(key=lambda c: -c[0])
        # Anchors are written after the conversations: a conversation saved whole restores
        # into its own sequence, and the shared prefix comes back with it.
        candidates += [(a.last_used, a) for a in anchors]

        def items() -> list[Saved]:
            out = []
            for used, c in candidates:
                if time.perf_counter() > deadline:
                    break
                if isinstance(c, Saved):
                    out.append(c)
                else:
                    data = read_state(self.ctx, c.seq_id)
                    if data:
                        out.append(Saved(tokens=list(c.cache), data=data, used=used, scope=c.scope))
            return out

        count, total = self.disk.save(items())
        log.info("prompt cache: %d prompts (%.1f MiB) written in %.2f s", count, total / 2**20, time.perf_counter() - t0)

    def counts(self) -> dict[str, int]:
        return {
            "host_prompts": len(self.host.entries),
            "host_bytes": self.host.bytes,
            "host_evictions": self.host.evictions,
            "restored": self.restored,
            "restore_failed": self.restore_failed,
            "tokens_restored": self.tokens_restored,
            "loaded_from_disk": self.loaded_from_disk,
            "spilled_idle": self.spilled_idle,
        }
