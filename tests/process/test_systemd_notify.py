"""`corral serve` speaks systemd's notify protocol, read from a fake NOTIFY_SOCKET exactly
as systemd would read it: READY=1 once listening, WATCHDOG=1 at half of WATCHDOG_USEC,
STATUS= lines, RELOADING=1 + MONOTONIC_USEC then READY=1 on SIGHUP, and STOPPING=1 on
SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, free_port
from tests.harness import write_gguf


def _datagrams(sink: socket.socket, until: float) -> list[str]:
    out: list[str] = []
    while time.monotonic() < until:
        sink.settimeout(max(0.01, until - time.monotonic()))
        try:
            out.append(sink.recv(4096).decode())
        except socket.timeout:
            break
    return out


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_watchdog_status_stopping(tmp_path: Path, abstract: bool) -> None:
    write_gguf(tmp_path / "m.gguf")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[server]\nport = {free_port()}\n[models.m]\npath = "m.gguf"\n')
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"corral-test-{os.getpid()}-{time.monotonic_ns()}"
        sink.bind("\0" + name)
        notify = "@" + name
    else:
        notify = str(tmp_path / "notify.sock")
        sink.bind(notify)
    env = {**os.environ, "NOTIFY_SOCKET": notify, "WATCHDOG_USEC": "400000"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", "--config", str(cfg)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        sink.settimeout(20)
        first = sink.recv(4096).decode()
        assert first.startswith("READY=1\nSTATUS=0 of 1 models loaded"), first
        # WATCHDOG_PID is unset, so the watchdog is ours: a ping every 0.2 s.
        later = _datagrams(sink, time.monotonic() + 1.0)
        pings = [d for d in later if d.split("\n")[0] == "WATCHDOG=1"]
        assert 3 <= len(pings) <= 7, later
        # SIGHUP reloads: RELOADING=1 and MONOTONIC_USEC in one datagram, then READY=1.
        proc.send_signal(signal.SIGHUP)
        reload_msgs = [d for d in _datagrams(sink, time.monotonic() + 1.0) if not d.startswith("WATCHDOG=1")]
        assert reload_msgs[0].startswith("RELOADING=1\nMONOTONIC_USEC="), reload_msgs
        usec = int(reload_msgs[0].split("MONOTONIC_USEC=")[1])
        assert abs(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000 - usec) < 5_000_000
        assert reload_msgs[1].startswith("READY=1\nSTATUS="), reload_msgs
        assert proc.poll() is None  # SIGHUP did not kill it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        rest = _datagrams(sink, time.monotonic() + 0.5)
        assert any(d.startswith("STOPPING=1\n") for d in rest), rest
    finally:
        if proc.poll() is None:
            proc.kill()
        sink.close()
