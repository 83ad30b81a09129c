"""worker/slot_folder.py: slot files opened inside the folder only, never through a link,
written whole or not at all, within the folder's bound (issue 40, finding 1)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Iterator

import pytest
import trio

from worker import slot_folder
from worker.slot_folder import FolderError


def test_a_file_written_is_read_back_whole(tmp_path: Path) -> None:
    slot_folder.write(str(tmp_path / "slots"), "a.bin", [b"abc", memoryview(b"defg")], 7, 0)
    assert slot_folder.read(str(tmp_path / "slots"), "a.bin", 0) == bytearray(b"abcdefg")
    assert (tmp_path / "slots").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "slots" / "a.bin").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (tmp_path / "slots").iterdir()) == ["a.bin"]


def test_a_planted_link_is_not_followed_on_restore(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    (tmp_path / "slots").mkdir()
    (tmp_path / "slots" / "link.bin").symlink_to(outside)
    with pytest.raises(FolderError, match="symbolic link"):
        slot_folder.read(str(tmp_path / "slots"), "link.bin", 0)


def test_a_save_over_a_planted_link_replaces_the_link_and_never_writes_through_it(tmp_path: Path) -> None:
    # Issue 40: a link in the folder to a file elsewhere had that file overwritten, and
    # one to a name elsewhere had it created.
    outside, absent = tmp_path / "outside.bin", tmp_path / "absent.bin"
    outside.write_bytes(b"keep me")
    folder = tmp_path / "slots"
    folder.mkdir()
    (folder / "over.bin").symlink_to(outside)
    (folder / "new.bin").symlink_to(absent)
    for name in ("over.bin", "new.bin"):
        slot_folder.write(str(folder), name, [b"slot"], 4, 0)
        assert not (folder / name).is_symlink() and (folder / name).read_bytes() == b"slot"
    assert outside.read_bytes() == b"keep me" and not absent.exists()


async def test_a_fifo_or_a_folder_is_refused_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "slots"
    folder.mkdir()
    os.mkfifo(folder / "pipe.bin")
    (folder / "dir.bin").mkdir()
    with trio.fail_after(5):  # opening a FIFO for reading must not wait for a writer
        for name in ("pipe.bin", "dir.bin"):
            with pytest.raises(FolderError, match="not a regular file"):
                await trio.to_thread.run_sync(slot_folder.read, str(folder), name, 0)


def test_no_such_file_and_no_folder_are_refusals(tmp_path: Path) -> None:
    with pytest.raises(FolderError, match="no such file"):
        slot_folder.read(str(tmp_path / "none"), "a.bin", 0)
    (tmp_path / "slots").mkdir()
    with pytest.raises(FolderError, match="no such file"):
        slot_folder.read(str(tmp_path / "slots"), "a.bin", 0)


def test_a_save_past_the_folders_bound_writes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "slots"
    slot_folder.write(str(folder), "a.bin", [b"x" * 600], 600, 1000)
    with pytest.raises(FolderError, match="slot_save_max_bytes") as exc:
        slot_folder.write(str(folder), "b.bin", [b"y" * 500], 500, 1000)
    assert exc.value.full
    assert sorted(p.name for p in folder.iterdir()) == ["a.bin"]
    # Replacing a file counts its new size, not both.
    slot_folder.write(str(folder), "a.bin", [b"z" * 900], 900, 1000)
    assert (folder / "a.bin").read_bytes() == b"z" * 900


def test_a_file_past_the_bound_is_not_read(tmp_path: Path) -> None:
    folder = tmp_path / "slots"
    slot_folder.write(str(folder), "a.bin", [b"x" * 600], 600, 0)
    with pytest.raises(FolderError, match="more than slot_save_max_bytes"):
        slot_folder.read(str(folder), "a.bin", 500)


def test_a_write_that_fails_midway_leaves_neither_the_file_nor_its_temporary(tmp_path: Path) -> None:
    folder = tmp_path / "slots"
    slot_folder.write(str(folder), "a.bin", [b"old"], 3, 0)

    def parts() -> Iterator[bytes]:
        yield b"half of it"
        raise OSError(errno.ENOSPC, "No space left on device")

    for name in ("a.bin", "b.bin"):
        with pytest.raises(FolderError, match="No space left") as exc:
            slot_folder.write(str(folder), name, parts(), 100, 0)
        assert exc.value.full
    assert sorted(p.name for p in folder.iterdir()) == ["a.bin"]
    assert (folder / "a.bin").read_bytes() == b"old"  # the old file stays whole


def test_a_stale_temporary_file_is_removed_by_the_next_save(tmp_path: Path) -> None:
    folder = tmp_path / "slots"
    folder.mkdir()
    stale, fresh = folder / ".corral-slot-0000.tmp", folder / ".corral-slot-1111.tmp"
    for p in (stale, fresh):
        p.write_bytes(b"t" * 100)
    old = time.time() - 3600
    os.utime(stale, (old, old))
    slot_folder.write(str(folder), "a.bin", [b"x"], 1, 10_000)
    assert not stale.exists() and fresh.exists()  # one in progress (another worker's) stays


def test_the_bound_counts_every_keys_folder_under_the_slot_folder(tmp_path: Path) -> None:
    # The outside probe of issue 40: with slot_actions = "keys", each key's folder was
    # bounded alone, and four keys filled the disk past slot_save_max_bytes for everyone.
    root = tmp_path / "slots"
    slot_folder.write(str(root / "key-a"), "a.bin", [b"a" * 600], 600, 1000, str(root))
    with pytest.raises(FolderError, match="slot_save_max_bytes") as exc:
        slot_folder.write(str(root / "key-b"), "b.bin", [b"b" * 600], 600, 1000, str(root))
    assert exc.value.full and not (root / "key-b" / "b.bin").exists()
    with pytest.raises(FolderError, match="slot_save_max_bytes"):
        slot_folder.write(str(root), "admin.bin", [b"c" * 600], 600, 1000)
    # A key replacing its own file counts that file once.
    slot_folder.write(str(root / "key-a"), "a.bin", [b"a" * 900], 900, 1000, str(root))


def test_a_save_over_a_folders_name_is_the_names_fault_not_the_servers(tmp_path: Path) -> None:
    root = tmp_path / "slots"
    (root / "adir").mkdir(parents=True)
    with pytest.raises(FolderError) as exc:
        slot_folder.write(str(root), "adir", [b"x"], 1, 0)
    assert not exc.value.full and not exc.value.server
    assert [p.name for p in root.iterdir()] == ["adir"]
