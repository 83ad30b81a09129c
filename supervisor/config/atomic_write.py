"""Replace a file so that a reader sees the old bytes or the new ones, never a mix.

A temporary file in the same folder (a rename across file systems is a copy), written and
fsynced, given the old file's mode and owner, renamed over the old one, and the folder
fsynced so that the rename itself survives a crash. A reader that opened the old file
keeps reading the old bytes; `corral serve`'s reload reads by path, so it gets one or the
other.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `data` to `path` atomically. An existing file's mode and owner carry over
    (owner only where permitted: a non-root user cannot give a file away, and then the file
    becomes theirs, as any editor would leave it); a new file gets `mode`, else 0o644 less
    the umask. Raises OSError; on any failure the old file is untouched and the temporary
    file is gone."""
    # Through a symlink to its target: renaming over the link would replace the link.
    path = Path(os.path.realpath(path))
    folder = path.parent
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            if st is not None:
                os.fchmod(f.fileno(), st.st_mode & 0o7777)
                try:
                    os.fchown(f.fileno(), st.st_uid, st.st_gid)
                except PermissionError:
                    pass
            else:
                umask = os.umask(0)
                os.umask(umask)
                os.fchmod(f.fileno(), (0o644 if mode is None else mode) & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
