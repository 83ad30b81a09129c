"""The prompt cache's step clock (worker/prompt_cache.py, `PromptCache.step`): parked
entries age by the decode steps that went by, also when a lone stream's steps arrive as
one count after running ahead (worker/run_ahead.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import worker.prompt_cache as pc
from worker.prompt_cache import SPILL_CHECK, CacheOptions, PromptCache


class Parked:
    def __init__(self) -> None:
        self.parked: list[Any] = [SimpleNamespace(idle_steps=0)]
        self.aged: list[int] = []

    def age(self, steps: int) -> None:
        self.aged.append(steps)
        for e in self.parked:
            e.idle_steps += steps


def cache(ram: int = 1 << 20) -> tuple[PromptCache, Parked]:
    kv = SimpleNamespace(attention=SimpleNamespace(n_swa=0, recurrent=False))
    entries = Parked()
    return PromptCache(None, kv, entries, CacheOptions(ram_bytes=ram)), entries  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def nothing_to_spill(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pc, "idle_to_spill", lambda parked, slots: None)


@pytest.mark.parametrize("counts", [[1] * 100, [32, 1, 31, 20, 16], [5, 40, 3, 52], [100]])
def test_entries_age_by_every_step_however_the_steps_are_counted(counts: list[int]) -> None:
    c, entries = cache()
    for n in counts:
        c.step([], n)
    total = sum(counts)
    # Checked at every SPILL_CHECK-th step, each check ageing them by SPILL_CHECK.
    assert sum(entries.aged) == total // SPILL_CHECK * SPILL_CHECK
    assert entries.parked[0].idle_steps == total // SPILL_CHECK * SPILL_CHECK


def test_without_host_memory_nothing_is_checked() -> None:
    c, entries = cache(ram=0)
    c.step([], 100)
    assert entries.aged == []
