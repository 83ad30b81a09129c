"""`[server] pid_file`: written by `corral serve`, read by `corral config --reload --signal`.

The writer replaces the file atomically (a reader never sees an empty or partial pid) and
removes it at exit only if it still holds its own pid (a second server may have taken it
over). The reader refuses a stale file before it signals anything: SIGHUP's default action
kills a process, so a pid that has since been reused by another program must not get one.
A process that started after the file was written cannot be the one that wrote it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psutil

from supervisor.config.atomic_write import write_atomically

# The file's mtime and the process's start time come from different clocks' roundings.
_SLACK_SECONDS = 1.0


class PidFileError(Exception):
    """The pid file names no running server; the message says why."""


def write(path: Path) -> None:
    """Write this process's pid. Raises OSError."""
    write_atomically(path, f"{os.getpid()}\n".encode())


@contextmanager
def held(path: str | None) -> Iterator[None]:
    """This process's pid in `path` (if any) for the length of the block. Raises OSError
    if it cannot be written, or FileExistsError if a live process holds it."""
    if path is None:
        yield
        return
    # A second server started by mistake on the same config must not take the file from
    # the first: it would fail to bind the port, then remove the file on its way out.
    try:
        other = read_live(Path(path))
    except PidFileError:
        other = None
    if other is not None and other != os.getpid():
        raise FileExistsError(f"{path}: process {other} is running with this pid_file; not starting a second server")
    write(Path(path))
    try:
        yield
    finally:
        remove_if_ours(Path(path))


def remove_if_ours(path: Path) -> None:
    """Remove the file if it holds this process's pid; never raises."""
    try:
        if path.read_text().strip() == str(os.getpid()):
            path.unlink()
    except (OSError, UnicodeDecodeError):
        pass


def read_live(path: Path) -> int:
    """The pid of the running server that wrote `path`. Raises PidFileError."""
    try:
        text = path.read_text()
        written = path.stat().st_mtime
    except FileNotFoundError:
        raise PidFileError(f"{path}: no such file (is corral serve running with this pid_file?)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PidFileError(f"{path}: cannot read: {exc}") from None
    if not text.strip().isdigit() or int(text) <= 1:
        raise PidFileError(f"{path}: holds no pid ({text[:40]!r})")
    pid = int(text)
    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        raise PidFileError(f"{path}: process {pid} is not running (stale pid file)") from None
    except psutil.AccessDenied as exc:
        raise PidFileError(f"{path}: cannot inspect process {pid}: {exc}") from None
    if started > written + _SLACK_SECONDS:
        raise PidFileError(f"{path}: process {pid} started after the file was written (stale pid file, pid reused)")
    return pid
