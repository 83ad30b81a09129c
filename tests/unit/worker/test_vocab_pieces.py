"""worker/vocab_pieces.py: a vocabulary's token bytes kept on disk between loads. A file is
used only when it is whole and was written for this model file, llama.cpp and vocabulary
size, and when the live check agrees; anything else is built again (and written again).
tests/e2e/test_tool_grammar_vocab.py checks the bytes themselves against llguidance's own
bridge on the demo model."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.vocab_pieces import Pieces, cache_folder, decode, encode, file_for, identity, load_or_build

IDENT: dict[str, object] = {"model": "/m.gguf", "size": 10, "mtime_ns": 5, "llama_cpp": "0.3.36", "n_vocab": 4}
PIECES = Pieces([b"a", b"", b"\xff<eos>", b" the"], [2])


class Builds:
    """A stand-in for llama.cpp: counts how often the pieces were built."""

    def __init__(self, pieces: Pieces = PIECES) -> None:
        self.pieces, self.count = pieces, 0

    def __call__(self) -> Pieces:
        self.count += 1
        return self.pieces


def test_the_first_load_builds_and_writes_the_next_reads_back(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    builds = Builds()
    assert load_or_build(IDENT, folder, builds, lambda p: True) == PIECES
    assert builds.count == 1 and file_for(folder, IDENT).is_file()
    assert load_or_build(IDENT, folder, builds, lambda p: True) == PIECES
    assert builds.count == 1, "read back, not built"


def test_pieces_that_fail_the_live_check_are_built_again_and_rewritten(tmp_path: Path) -> None:
    stale = Pieces([b"x", b"y", b"z", b"w"], [2])
    load_or_build(IDENT, tmp_path, Builds(stale), lambda p: True)
    builds = Builds()
    assert load_or_build(IDENT, tmp_path, builds, lambda p: p == PIECES) == PIECES and builds.count == 1
    assert decode(file_for(tmp_path, IDENT).read_bytes(), IDENT) == PIECES, "the file now holds the new pieces"


def test_another_model_file_or_build_is_another_file_and_a_header_that_lies_is_refused(tmp_path: Path) -> None:
    data = encode(IDENT, PIECES)
    for key, value in (("mtime_ns", 6), ("size", 11), ("llama_cpp", "0.3.37"), ("model", "/n.gguf")):
        other = {**IDENT, key: value}
        assert file_for(tmp_path, other) != file_for(tmp_path, IDENT)
        assert decode(data, other) is None, key


def test_an_unwritable_folder_still_gives_the_pieces(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    builds = Builds()
    assert load_or_build(IDENT, blocker / "below", builds, lambda p: True) == PIECES
    assert load_or_build(IDENT, None, builds, lambda p: True) == PIECES
    assert builds.count == 2


def test_a_file_cut_anywhere_is_not_read() -> None:
    data = encode(IDENT, PIECES)
    assert decode(data, IDENT) == PIECES
    for cut in range(len(data)):
        assert decode(data[:cut], IDENT) is None, cut
    assert decode(data + b"x", IDENT) is None


@settings(max_examples=300)
@given(st.data())
def test_a_changed_byte_anywhere_is_refused_or_changes_nothing(data: st.DataObject) -> None:
    whole = bytearray(encode(IDENT, PIECES))
    at = data.draw(st.integers(0, len(whole) - 1))
    whole[at] = data.draw(st.integers(0, 255).filter(lambda b: b != whole[at]))
    assert decode(bytes(whole), IDENT) in (None, PIECES)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_refused_without_an_exception(blob: bytes) -> None:
    assert decode(blob, IDENT) is None
    assert decode(b"corral-vocab-pieces 1\n" + blob, IDENT) is None


def test_the_folder_follows_the_environment() -> None:
    assert cache_folder({"CORRAL_CACHE_DIR": "/c", "HOME": "/h"}) == Path("/c")
    assert cache_folder({"CACHE_DIRECTORY": "/var/cache/corral:/other", "HOME": "/h"}) == Path("/var/cache/corral/corral")
    assert cache_folder({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/corral")
    assert cache_folder({"HOME": "/h"}) == Path("/h/.cache/corral")
    assert cache_folder({}) is None


def test_identity_names_the_file_by_what_it_is(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 7)
    (tmp_path / "link.gguf").symlink_to(model)
    a = identity(str(model), "v", 3)
    assert a == identity(str(tmp_path / "link.gguf"), "v", 3), "a link to the file is the same file"
    assert a["size"] == 7 and a["n_vocab"] == 3
    model.write_bytes(b"y" * 8)
    assert identity(str(model), "v", 3) != a


def test_a_new_file_replaces_those_of_its_models_old_version_and_of_models_gone(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"")
    (tmp_path / "other.gguf").write_bytes(b"")
    ident = {**IDENT, "model": str(tmp_path / "m.gguf")}
    old = {**ident, "mtime_ns": 1}
    other_model = {**IDENT, "model": str(tmp_path / "other.gguf")}
    gone = {**IDENT, "model": str(tmp_path / "deleted.gguf")}
    for each in (old, other_model, gone):
        load_or_build(each, tmp_path, Builds(), lambda p: True)
    load_or_build(ident, tmp_path, Builds(), lambda p: True)
    assert sorted((tmp_path / "vocab").glob("*.pieces")) == sorted([file_for(tmp_path, ident), file_for(tmp_path, other_model)])
