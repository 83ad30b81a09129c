"""systemd notify helpers: address mapping, watchdog interval, worker environment."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from supervisor.systemd import Notifier, child_environment, socket_address


def test_abstract_namespace_address() -> None:
    assert socket_address("@corral/notify") == "\0corral/notify"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    assert Notifier({"WATCHDOG_USEC": "4000000"}).watchdog_interval == 2.0
    assert Notifier({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_interval == 2.0


def test_watchdog_for_another_pid_or_malformed_is_off() -> None:
    assert Notifier({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}).watchdog_interval is None
    assert Notifier({"WATCHDOG_USEC": "soon"}).watchdog_interval is None
    assert Notifier({"WATCHDOG_USEC": "0"}).watchdog_interval is None
    assert Notifier({}).watchdog_interval is None


def test_without_notify_socket_nothing_is_sent() -> None:
    n = Notifier({})
    assert not n.enabled
    n.notify("READY=1")  # a no-op, not an error


def test_one_datagram_per_message(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sink:
        sink.bind(str(path))
        n = Notifier({"NOTIFY_SOCKET": str(path)})
        n.notify("RELOADING=1", "MONOTONIC_USEC=123")
        n.notify("READY=1")
        assert sink.recv(4096) == b"RELOADING=1\nMONOTONIC_USEC=123"
        assert sink.recv(4096) == b"READY=1"


def test_workers_do_not_inherit_notify_variables() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "2", "PATH": "/bin"}
    assert child_environment(env) == {"PATH": "/bin"}
