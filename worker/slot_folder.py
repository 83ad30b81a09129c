"""The slot folder on disk ([server] slot_save_path): files opened inside it only, written
whole or not at all, within a bound.

- A name is looked up in the folder itself (openat on the folder's descriptor), never
  through a symbolic link: one planted in the folder, to a file elsewhere, is refused on
  restore and replaced (not followed) on save. The router has already refused names with
  a path separator or `..` (router/api/llama/slot_files.py).
- Only a regular file is read (a FIFO or a device would block the engine or never end),
  and only up to the folder's bound.
- A save is written under a temporary name and renamed over the file once it is whole, so
  a full disk or a killed worker leaves the old file or none, never a torn one; the
  temporary file is removed on any failure.
- The folder's files may take `max_bytes` in all: a save that would pass it is refused
  before anything is written.

Blocking file I/O: the engine thread calls it between steps, as llama-server does its own.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import time
from typing import Iterable

# Temporary files of saves in progress; one older than this was left by a worker that was
# killed mid-write, and is removed by the next save.
_TMP_PREFIX = ".corral-slot-"
_STALE_SECONDS = 600.0


class FolderError(Exception):
    """A slot file that cannot be read or written. `full`: for want of room (the bound, or
    the disk), which the client hears as 507; `server`: the folder's own fault (its
    permissions, say), a 500; otherwise the name's or the file's fault, a 400."""

    def __init__(self, message: str, full: bool = False, server: bool = False) -> None:
        super().__init__(message)
        self.full, self.server = full, server


def _open_folder(folder: str, create: bool) -> int:
    if create:
        # Slot files hold users' conversations: only the server's user may read them.
        os.makedirs(folder, mode=0o700, exist_ok=True)
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FolderError("no such file") from None


def read(folder: str, name: str, max_bytes: int) -> bytearray:
    """The whole of file `name` in `folder`, at most `max_bytes` long (0: no bound)."""
    dfd = _open_folder(folder, create=False)
    try:
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer.
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            raise FolderError("no such file") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FolderError("the name is a symbolic link") from None
            raise FolderError(f"cannot open it ({exc.strerror})") from None
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FolderError("not a regular file")
    with open(fd, "rb", buffering=0) as f:
        if max_bytes and st.st_size > max_bytes:
            raise FolderError(f"the file is {st.st_size} bytes, more than slot_save_max_bytes ({max_bytes})")
        data = bytearray(st.st_size)
        view, got = memoryview(data), 0
        while got < len(data):
            n = f.readinto(view[got:])
            if not n:
                raise FolderError("the file changed while it was read")
            got += n
        if f.read(1):
            raise FolderError("the file changed while it was read")
    return data


def _usage(root: str, replacing: str, now: float) -> int:
    """Bytes the regular files under `root` take, in it and in its folders one level down
    (each key's, with slot_actions = "keys"), but `replacing` (a save replaces it). Stale
    temporary files are removed on the way. Links are not followed."""
    total = 0
    folders = [root]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) and folder == root:
                folders.append(entry.path)
            if not stat.S_ISREG(st.st_mode) or os.path.normpath(entry.path) == replacing:
                continue
            if entry.name.startswith(_TMP_PREFIX) and now - st.st_mtime > _STALE_SECONDS:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                continue
            total += st.st_size
    return total


def write(
    folder: str, name: str, parts: Iterable[bytes | memoryview], size: int, max_bytes: int, bound_root: str = ""
) -> None:
    """Write `parts` (`size` bytes in all) as file `name` in `folder`, whole or not at all,
    within the bound `max_bytes` (0: none) on what the files under `bound_root` (the slot
    folder; "": `folder` itself) take in all. Raises FolderError."""
    try:
        dfd = _open_folder(folder, create=True)
    except OSError as exc:
        raise FolderError(f"cannot open the slot folder ({exc.strerror})", server=True) from None
    tmp = _TMP_PREFIX + secrets.token_hex(8) + ".tmp"
    try:
        if max_bytes:
            replacing = os.path.normpath(os.path.join(folder, name))
            used = _usage(os.path.normpath(bound_root or folder), replacing, time.time())
            if used + size > max_bytes:
                raise FolderError(
                    f"the slot folder holds {used} bytes and this save needs {size}: past "
                    f"slot_save_max_bytes ({max_bytes}). Erase or remove slot files first",
                    full=True,
                )
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            with open(fd, "wb", buffering=0) as f:
                for part in parts:
                    view = memoryview(part)
                    while view:
                        view = view[f.write(view) or 0 :]
            # rename() replaces a symbolic link named `name` itself, never its target.
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        # A folder, or another thing that is no file, already under that name: the name's fault.
        named = exc.errno in (errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY, errno.EEXIST)
        raise FolderError(f"cannot write it ({exc.strerror})", full=full, server=not (full or named)) from None
    finally:
        os.close(dfd)
