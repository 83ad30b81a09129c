"""The per-step KV invariant check (worker/kv_cache.py), against a stand-in for
llama.cpp's memory: whatever shortcut it takes for a free sequence, a sequence whose book
and cells disagree is dropped and counted, and one that agrees is left alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import worker.kv_cache as kv_cache_mod
from worker.kv_cache import KvCache
from worker.kv_rules import Attention
from worker.slots import Slot


class Memory:
    """Positions held per sequence, as llama_memory_seq_pos_min/max report them."""

    def __init__(self) -> None:
        self.cells: dict[int, list[int]] = {}
        self.calls = 0

    def pos_min(self, _mem: object, seq: int) -> int:
        self.calls += 1
        return min(self.cells.get(seq) or [-1])

    def pos_max(self, _mem: object, seq: int) -> int:
        self.calls += 1
        return max(self.cells.get(seq) or [-1])

    def rm(self, _mem: object, seq: int, p0: int, p1: int) -> bool:
        assert (p0, p1) == (-1, -1)
        self.cells.pop(seq, None)
        return True


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Memory:
    m = Memory()
    fake = SimpleNamespace(llama_memory_seq_pos_min=m.pos_min, llama_memory_seq_pos_max=m.pos_max,
                           llama_memory_seq_rm=m.rm)
    monkeypatch.setattr(kv_cache_mod, "llama_cpp", fake)
    return m


def check(kv: KvCache, slots: list[Slot[object]]) -> list[int]:
    dropped: list[int] = []
    kv.check(slots, lambda s: dropped.append(s.seq_id))
    return dropped


def test_books_that_agree_are_left_alone(memory: Memory) -> None:
    kv = KvCache(None, Attention())
    memory.cells = {0: [0, 1, 2, 3]}
    slots: list[Slot[object]] = [Slot(seq_id=0, cache=[5, 6, 7, 8]), Slot(seq_id=1)]
    assert check(kv, slots) == [] and kv.repairs == 0
    assert slots[0].cache == [5, 6, 7, 8] and memory.cells == {0: [0, 1, 2, 3]}


def test_a_free_sequence_costs_one_call(memory: Memory) -> None:
    kv = KvCache(None, Attention())
    check(kv, [Slot(seq_id=s) for s in range(8)])
    assert memory.calls == 8


def test_cells_under_an_empty_book_are_dropped_and_counted(memory: Memory) -> None:
    kv = KvCache(None, Attention())
    memory.cells = {3: [0, 1, 2]}
    assert check(kv, [Slot(seq_id=2), Slot(seq_id=3)]) == [3]
    assert kv.repairs == 1 and 3 not in memory.cells


def test_a_book_longer_than_its_cells_is_dropped(memory: Memory) -> None:
    kv = KvCache(None, Attention())
    memory.cells = {0: [0, 1, 2]}
    slot: Slot[object] = Slot(seq_id=0, cache=[1, 2, 3, 4])
    assert check(kv, [slot]) == [0]
    assert slot.cache == [] and kv.repairs == 1 and memory.cells == {}
