"""The prompt cache beyond the KV cache: saved sequences in host memory, and on disk across
worker restarts.

When the KV cache gives up a parked entry (worker/kv_entries.py) to make room, its cells are
read out (worker/seq_state.py) and kept here with their tokens, within a byte budget, least
recently used first to go. A later prompt that continues one of them has it written back
into a sequence instead of decoding it again. When the worker stops cleanly (an idle unload,
a reload, a shutdown), the hottest saved prompts, those still in the KV cache first, are
written to the model's cache folder, and read back when the model loads again, so that the
first turn after a reload finds its conversation as a warm one does.

A file is valid only for the model file, chat template and llama.cpp it was written with
(`fingerprint`); others are removed when the folder is read. Files are written whole under a
temporary name and renamed, so a worker killed mid-write leaves no torn file.

What is restored is checked before it is served from: the cells read must span exactly the
saved tokens (worker/kv_cache.py, KvCache.restore), and the engine's invariant check covers
the sequence from then on.
"""

from __future__ import annotations

import array
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from worker.slots import common_prefix, reusable_prefix

log = logging.getLogger("worker.cache")

_MAGIC = b"corral-prompt 1\n"


@dataclass(eq=False)
class Saved:
    """A sequence's tokens and the bytes of its KV cells."""

    tokens: list[int]
    data: bytes
    used: int  # the admission clock when it was last used
    scope: str = ""  # the cache scope its cells belong to (Slot.scope)


def fingerprint(model_path: str, template: str, llama_version: str, layout: str) -> str:
    """What saved cells depend on: the model file (path, size, modification time), the chat
    template (a changed template renders other tokens for the same messages, so the saved
    prompts would be served to nobody), the llama.cpp build, and the KV layout."""
    st = os.stat(model_path)
    parts = [os.path.realpath(model_path), str(st.st_size), str(st.st_mtime_ns), template, llama_version, layout]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def best_saved(
    saved: Sequence[Saved], prompt: Sequence[int], at_least: int, whole_only: bool
) -> tuple[Saved, int] | None:
    """The saved prompt that gives `prompt` the longest prefix, when longer than
    `at_least` tokens (what the KV cache already gives). `whole_only`: a sliding-window or
    recurrent model keeps only the cells near a sequence's end, so a saved prompt serves
    only one that continues it."""
    best: tuple[Saved, int] | None = None
    for s in saved:
        n = reusable_prefix(s.tokens, prompt)
        if whole_only and n < len(s.tokens) - 1:
            continue
        if n > at_least and (best is None or n > best[1]):
            best = (s, n)
    return best


class HostCache:
    """Saved prompts in host memory, at most `budget` bytes of cells."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.entries: list[Saved] = []  # least recently used first
        self.bytes = 0
        self.evictions = 0

    def put(self, item: Saved) -> bool:
        """Keep `item`, giving up the least recently used to stay within the budget. A
        saved prompt that another one continues adds nothing: the longer one is kept."""
        if not item.data or len(item.data) > self.budget:
            return False
        for other in list(self.entries):
            if other.scope != item.scope:
                continue  # the same tokens of another scope serve only that scope
            shared = common_prefix(other.tokens, item.tokens)
            if shared == len(item.tokens):  # `other` continues it: nothing new
                other.used = max(other.used, item.used)
                self.entries.sort(key=lambda s: s.used)
                return False
            if shared == len(other.tokens):
                self._remove(other)
        self.entries.append(item)
        self.entries.sort(key=lambda s: s.used)
        self.bytes += len(item.data)
        while self.bytes > self.budget:
            self._remove(self.entries[0])
            self.evictions += 1
        return True

    def resize(self, budget: int) -> None:
        """A new budget (the supervisor's share): the least recently used go until it holds."""
        self.budget = budget
        while self.entries and self.bytes > budget:
            self._remove(self.entries[0])
            self.evictions += 1

    def take(self, item: Saved) -> None:
        """`item` goes back into the KV cache."""
        self._remove(item)

    def _remove(self, item: Saved) -> None:
        self.entries.remove(item)
        self.bytes -= len(item.data)


class DiskStore:
    """The hottest saved prompts of one model, as files in its cache folder."""

    def __init__(self, folder: Path, fingerprint: str, budget: int) -> None:
        self.folder, self.fingerprint, self.budget = folder, fingerprint, budget

    def load(self, limit: int) -> list[Saved]:
        """The saved prompts written for this fingerprint, most recently used first, at most
        `limit` bytes of them; files written for another model, template or build, and
        unreadable ones, are removed."""
        out: list[Saved] = []
        if not self.folder.is_dir():
            return out
        for path in self.folder.glob("*.prompt"):
            item = self._read(path)
            if item is None:
                log.info("prompt cache: removing %s (another model, template or build)", path.name)
                path.unlink(missing_ok=True)
            else:
                out.append(item)
        out.sort(key=lambda s: -s.used)
        kept, total = [], 0
        for item in out:
            if total + len(item.data) <= limit:
                kept.append(item)
                total += len(item.data)
        return kept

    def save(self, hottest: Iterable[Saved]) -> tuple[int, int]:
        """Write `hottest` (most valuable first) until the budget is spent, and remove every
        other file of the folder. Returns (prompts, bytes) written."""
        # Conversations are the users' own: only the server's user may read them.
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        written: set[str] = set()
        count = total = 0
        for item in hottest:
            if total + len(item.data) > self.budget:
                continue
            digest = hashlib.sha256(item.scope.encode() + b"\0" + array.array("i", item.tokens).tobytes())
            name = digest.hexdigest()[:32] + ".prompt"
            if name in written:
                continue
            self._write(self.folder / name, item)
            written.add(name)
            count += 1
            total += len(item.data)
        for path in [*self.folder.glob("*.prompt"), *self.folder.glob("*.tmp")]:
            if path.name not in written:
                path.unlink(missing_ok=True)  # and what a write cut short left
        return count, total

    def _write(self, path: Path, item: Saved) -> None:
        header = json.dumps(
            {"fingerprint": self.fingerprint, "n_tokens": len(item.tokens), "used": item.used, "scope": item.scope}
        ).encode()
        tmp = path.with_suffix(".tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(_MAGIC)
            f.write(len(header).to_bytes(4, "little"))
            f.write(header)
            f.write(array.array("i", item.tokens).tobytes())
            f.write(item.data)
        os.replace(tmp, path)

    def _read(self, path: Path) -> Saved | None:
        try:
            raw = path.read_bytes()
            if not raw.startswith(_MAGIC):
                return None
            at = len(_MAGIC)
            size = int.from_bytes(raw[at : at + 4], "little")
            header = json.loads(raw[at + 4 : at + 4 + size])
            if header.get("fingerprint") != self.fingerprint:
                return None
            n = int(header["n_tokens"])
            start = at + 4 + size
            tokens = array.array("i")
            tokens.frombytes(raw[start : start + 4 * n])
            data = raw[start + 4 * n :]
            if len(tokens) != n or n <= 0 or not data:
                return None
            scope = header.get("scope", "")
            if not isinstance(scope, str):
                return None
            return Saved(tokens=tokens.tolist(), data=data, used=int(header.get("used", 0)), scope=scope)
        except (OSError, ValueError, KeyError, TypeError):
            return None
