"""The error a model load ends with when a user can act on it."""

from __future__ import annotations


class LoadError(Exception):
    """A load that failed for a reason a user can act on.

    `message` reaches clients (through the supervisor's 503s), so it names no local path:
    the server's file layout is not theirs to see. `detail` goes to the log, path and all.
    """

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or message
