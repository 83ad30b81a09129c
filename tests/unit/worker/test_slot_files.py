"""Issue 22, item 4: the pure parts of llama-server's slot actions: the file names its
fs_validate_filename (common/common.cpp) admits, and the two token-list layouts a slot
file may hold (test_slot_save.py test_slot_restore_legacy_token_list)."""

from __future__ import annotations

import pytest

from router.api.llama.slot_files import valid_filename
from worker.slot_file_format import unpacked


@pytest.mark.parametrize("name", ["slot1.bin", "a", "my slot.bin", "é.bin", "x" * 255, ".hidden"])
def test_plain_names_are_valid(name: str) -> None:
    assert valid_filename(name)


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "../x", "a/b", "a\\b", "c:x", "a*", "a?", 'a"', "a<", "a>", "a|", " a", "a ", "a.",
     "a\x00b", "a\x1fb", "a\x7fb", "x" * 256, "é" * 128, "a\uff0eb", "a\u2215b", "a\ufeff"],
)
def test_names_llama_cpp_refuses_are_refused(name: str) -> None:
    assert not valid_filename(name)


def test_both_token_layouts_are_read() -> None:
    assert unpacked([5, 6, 7]) == [5, 6, 7]  # llama.cpp's plain list
    assert unpacked([-1, 1, 3, 5, 6, 7]) == [5, 6, 7]  # llama-server's packed header
    assert unpacked([-1, 1, 9, 5]) is None  # a header whose count does not add up
