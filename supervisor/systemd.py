"""systemd's notify protocol, written directly: one AF_UNIX datagram per message.

The PyPI `sdnotify` package swallows errors and is unmaintained; the protocol is a few
lines. With no NOTIFY_SOCKET (not started by systemd) every call is a no-op.

Only the main process may notify (`NotifyAccess=main`), so `child_environment` strips the
variables before workers are spawned.

Notifying never blocks the event loop (issue 40, finding 7). A datagram socket blocks its
sender while the receiver's queue is full (ten datagrams by default on Linux), and a
receiver that stops reading would then stall every request. So the socket is
non-blocking, and what cannot be sent now waits in `Pending` (pure: which messages are
kept, and which a later one replaces) and is sent before anything newer, at the next
notify or `flush()` (corral/serve.py flushes at least once a second).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Mapping

log = logging.getLogger("corral.systemd")

_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")

# The most messages kept while the receiver reads none: a storm of reloads must not grow
# without bound; past it the oldest go, since what systemd acts on is the latest state.
MAX_PENDING = 16


def socket_address(value: str) -> str:
    """NOTIFY_SOCKET as a connect() address: a leading '@' names the abstract namespace."""
    return "\0" + value[1:] if value.startswith("@") else value


class Pending:
    """Messages not yet sent, oldest first, and what happens to each kind while it waits:

    - READY=1, RELOADING=1, STOPPING=1 are kept, in order: they change the state systemd
      holds of the service (a READY=1 lost would have systemd kill a healthy service at
      TimeoutStartSec; RELOADING=1 without its READY=1 would leave it "reloading").
    - WATCHDOG=1 is dropped: it says the loop is alive now, and the next one follows in
      half the watchdog period. Sent late it would say nothing true.
    - STATUS= is kept until a newer STATUS= replaces it: only the latest is worth showing.
    A message that is several lines keeps what of it is kept by these rules."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, ...]] = []

    def add(self, lines: tuple[str, ...]) -> None:
        kept = tuple(line for line in lines if _key(line) != "WATCHDOG")
        if not kept:
            return
        if any(_key(line) == "STATUS" for line in kept):
            # A newer STATUS= replaces a waiting one; a message that carried only that goes.
            older = [tuple(line for line in m if _key(line) != "STATUS") for m in self.messages]
            self.messages = [m for m in older if m]
        self.messages.append(kept)
        del self.messages[:-MAX_PENDING]

    def __bool__(self) -> bool:
        return bool(self.messages)


def _key(line: str) -> str:
    return line.split("=", 1)[0]


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET", "")
        self._address = socket_address(raw) if raw else None
        self._sock: socket.socket | None = None
        self._pending = Pending()
        self.watchdog_interval = _watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *lines: str) -> None:
        """Send one datagram of `KEY=value` lines (several lines make one atomic message).
        Never blocks: a message the receiver has no room for now waits, as `Pending` says,
        behind any that already wait, so systemd hears them in order.

        Failures are logged, not raised: losing a status line must not stop the server,
        and a missed watchdog ping is what systemd is there to notice.
        """
        if self._address is None:
            return
        self.flush()
        if not self._pending and self._send(lines):
            return
        self._pending.add(lines)

    def flush(self) -> None:
        """Send what waits, oldest first, until the receiver has no room; never blocks."""
        while self._pending and self._send(self._pending.messages[0]):
            self._pending.messages.pop(0)

    def _send(self, lines: tuple[str, ...]) -> bool:
        """Whether the datagram is done with: sent, or failed for good (logged, dropped).
        False: the receiver has no room now."""
        assert self._address is not None
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(lines).encode(), self._address)
        except BlockingIOError:
            return False
        except OSError as exc:
            log.warning("sd_notify %s failed: %s", _key(lines[0]), exc)
        return True


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Seconds between WATCHDOG=1 pings: half of WATCHDOG_USEC, as sd_watchdog_enabled
    recommends; None when the watchdog is off or meant for another process."""
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1_000_000 if value > 0 else None


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a worker: everything but systemd's notify variables."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k not in _VARIABLES}
