"""One edit of a config file on disk: read, edit the text, validate, write atomically.

The validation is `serve`'s own (supervisor.config.from_bytes on the new bytes, relative
to the file's folder), so an edit that `serve` or a reload would refuse is refused here,
and the file is not touched at all: not its bytes, not its mtime. Two `corral config`
edits at once are serialized by a lock on the file's folder (flock on a directory works
on Linux and leaves no lock file behind), so neither loses the other's change.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from supervisor.config.atomic_write import write_atomically
from supervisor.config.reading import from_bytes, read_bytes
from supervisor.config.schema import Config, ConfigError


@dataclass(frozen=True)
class Rewritten:
    path: Path
    before: str
    after: str
    config: Config  # the new file, validated

    @property
    def changed(self) -> bool:
        return self.before != self.after


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def rewrite(path: Path, edit: Callable[[str], str]) -> Rewritten:
    """Apply `edit` (text to text; it raises to refuse) to the file at `path`, validate the
    result and write it atomically. Raises ConfigError naming the key path of every problem
    (the file untouched), or OSError from the write. An edit that changes nothing writes
    nothing."""
    real = Path(os.path.realpath(path))
    with _locked(real.parent):
        data = read_bytes(real)
        try:
            before = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError([f"(file): not UTF-8 text (byte {exc.start})"], str(path)) from exc
        # The rename would go through a read-only file (it needs only the folder's write
        # permission); a file marked read-only is one somebody meant to keep as it is.
        if not os.stat(real).st_mode & 0o222 or not os.access(real, os.W_OK):
            raise ConfigError([f"(file): {real} is read-only; make it writable to edit it"], str(path))
        after = edit(before)
        new = after.encode("utf-8")
        config = from_bytes(new, path)
        # `serve` runs a config whose model file cannot load (that model fails alone), but
        # an edit does not bring in a new one: `config add-model` with a typo in the path
        # is refused, while `config set server.port` works with one bad download present.
        added = _new_problems(config.unloadable, data, path)
        if added:
            raise ConfigError(added, str(path))
        if after != before:
            write_atomically(real, new)
    return Rewritten(path, before, after, config)


def _new_problems(unloadable: dict[str, str], data: bytes, path: Path) -> list[str]:
    """The unloadable-file problems of the edited config that the file before the edit
    did not have."""
    try:
        old = from_bytes(data, path).unloadable
    except ConfigError:
        old = {}
    return [problem for name, problem in unloadable.items() if old.get(name) != problem]
