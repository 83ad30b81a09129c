"""systemd notify helpers: address mapping, watchdog interval, worker environment, and
what waits while the receiver has no room."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from supervisor.systemd import MAX_PENDING, Notifier, Pending, child_environment, socket_address


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


def test_what_waits_is_what_systemd_must_still_hear() -> None:
    p = Pending()
    p.add(("WATCHDOG=1",))
    assert p.messages == []  # a late ping is no ping
    p.add(("READY=1", "STATUS=a"))
    p.add(("WATCHDOG=1", "STATUS=b"))
    p.add(("RELOADING=1", "MONOTONIC_USEC=5"))
    p.add(("STATUS=c",))
    p.add(("READY=1", "STATUS=d"))
    # State changes kept in order; only the newest status, where it was said.
    assert p.messages == [("READY=1",), ("RELOADING=1", "MONOTONIC_USEC=5"), ("READY=1", "STATUS=d")]
    for i in range(2 * MAX_PENDING):
        p.add(("RELOADING=1", f"MONOTONIC_USEC={i}"))
    assert len(p.messages) == MAX_PENDING and p.messages[-1] == ("RELOADING=1", f"MONOTONIC_USEC={2 * MAX_PENDING - 1}")


def test_a_receiver_that_is_gone_is_logged_and_never_kept_waiting(tmp_path: Path) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody.sock")})
    notifier.notify("READY=1")  # ENOENT: logged, dropped
    assert not notifier._pending
