"""systemd's notify protocol, written directly: one AF_UNIX datagram per message.

The PyPI `sdnotify` package swallows errors and is unmaintained; the protocol is a few
lines. With no NOTIFY_SOCKET (not started by systemd) every call is a no-op.

Only the main process may notify (`NotifyAccess=main`), so `child_environment` strips the
variables before workers are spawned.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Mapping

log = logging.getLogger("corral.systemd")

_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def socket_address(value: str) -> str:
    """NOTIFY_SOCKET as a connect() address: a leading '@' names the abstract namespace."""
    return "\0" + value[1:] if value.startswith("@") else value


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET", "")
        self._address = socket_address(raw) if raw else None
        self._sock: socket.socket | None = None
        self.watchdog_interval = _watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *lines: str) -> None:
        """Send one datagram of `KEY=value` lines (several lines make one atomic message).

        Failures are logged, not raised: losing a status line must not stop the server,
        and a missed watchdog ping is what systemd is there to notice.
        """
        if self._address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(lines).encode(), self._address)
        except OSError as exc:
            log.warning("sd_notify %s failed: %s", lines[0].split("=", 1)[0], exc)


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
