"""Views of llama.cpp's logits rows (worker/logits.py): a view is of the row llama.cpp
named this time, by its address, never one remembered from an earlier step; writes reach
the row itself; a batch entry without logits is an error, not a view of address 0."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import worker.logits as logits_mod
from worker.logits import logits_at


class Rows:
    """llama_get_logits_ith's stand-in: batch index -> the address of a numpy row."""

    def __init__(self, n_vocab: int) -> None:
        self.rows: dict[int, np.ndarray] = {}
        self.n_vocab = n_vocab

    def put(self, index: int, values: list[float]) -> np.ndarray:
        row = np.array(values, dtype=np.float32)
        assert row.size == self.n_vocab
        self.rows[index] = row
        return row

    def __call__(self, _ctx: Any, index: int) -> int | None:
        row = self.rows.get(index)
        return None if row is None else int(row.ctypes.data)


@pytest.fixture
def rows(monkeypatch: pytest.MonkeyPatch) -> Rows:
    r = Rows(4)
    monkeypatch.setattr(logits_mod, "_logits_ith", r)
    monkeypatch.setattr(logits_mod, "_views", {})
    return r


def test_each_index_views_its_own_row_and_writes_reach_it(rows: Rows) -> None:
    a = rows.put(0, [1, 5, 2, 0])
    b = rows.put(3, [9, 0, 0, 1])
    assert logits_at(None, 0, 4).tolist() == [1, 5, 2, 0]
    assert logits_at(None, 3, 4).tolist() == [9, 0, 0, 1]
    logits_at(None, 0, 4)[1] = -1.0
    assert a[1] == -1.0 and b[1] == 0.0


def test_a_row_that_moved_is_read_where_it_is_now(rows: Rows) -> None:
    rows.put(0, [1, 2, 3, 4])
    first = logits_at(None, 0, 4)
    kept = rows.rows[0]  # keep the old row's memory alive: a new row lands elsewhere
    rows.put(0, [7, 7, 7, 8])  # llama.cpp regrew its buffer: index 0 is somewhere else now
    assert logits_at(None, 0, 4).tolist() == [7, 7, 7, 8]
    assert first.tolist() == kept.tolist() == [1, 2, 3, 4]


def test_the_same_address_at_another_length_is_another_view(rows: Rows) -> None:
    rows.put(0, [1, 2, 3, 4])
    assert logits_at(None, 0, 4).size == 4
    assert logits_at(None, 0, 2).tolist() == [1, 2]  # a draft model's smaller vocabulary


def test_no_logits_at_an_index_is_an_error(rows: Rows) -> None:
    with pytest.raises(ValueError, match="batch index 2"):
        logits_at(None, 2, 4)


def test_the_views_kept_are_bounded(rows: Rows, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logits_mod, "_MAX_VIEWS", 3)
    for i in range(10):
        rows.put(i, [float(i)] * 4)
        assert logits_at(None, i, 4)[0] == i
        assert len(logits_mod._views) <= 3
