"""`corral serve` whose NOTIFY_SOCKET receiver has stopped reading (its queue full) keeps
answering requests while it pings the watchdog, and systemd hears READY=1 once it reads
again (issue 40, finding 7: the notify datagrams were sent with a blocking sendto from the
event loop, which then waited for the receiver, and served nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.e2e.conftest import ROOT, free_port
from tests.harness import write_gguf
from tests.unit.supervisor.test_systemd_notify_never_blocks import full_receiver, read_all


def test_a_notify_receiver_that_stops_reading_never_stalls_the_server(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf")
    port = free_port()
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[server]\nport = {port}\n[models.m]\npath = "m.gguf"\n')
    sink = full_receiver(tmp_path / "notify.sock")
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "200000"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", "--config", str(cfg)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # up: its READY=1 could not be sent, so only a request says so
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "never answered /health"
                assert proc.poll() is None
                time.sleep(0.1)
        # A ping every 0.1 s, none of which fits: every request is still answered at once.
        for _ in range(10):
            started = time.monotonic()
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code == 200
            assert time.monotonic() - started < 1.0
            time.sleep(0.1)
        # The receiver reads again: READY=1 reaches it, flushed within a second.
        read_all(sink)
        heard: list[bytes] = []
        while not any(d.startswith(b"READY=1") for d in heard) and time.monotonic() < deadline:
            time.sleep(0.1)
            heard += read_all(sink)
        assert any(d.split(b"\n")[0] == b"READY=1" for d in heard), heard
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sink.close()
