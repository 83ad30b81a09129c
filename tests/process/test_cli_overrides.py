"""`corral --version`, and `corral serve --host/--port` over the file's [server]."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from functools import partial
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
import trio

from corral.listen import CannotListen
from corral.serve import serve
from supervisor.config import load
from tests.harness import write_config
from tests.process.support import WORKER_COMMAND


def _corral(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corral", *args], capture_output=True, text=True, timeout=60)


def test_version() -> None:
    done = _corral("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"corral {version('corral')}"


def test_host_on_the_command_line_is_checked_like_the_files(tmp_path: Path) -> None:
    path = write_config(tmp_path / "config.toml", {"a": {}})
    done = _corral("serve", "--config", str(path), "--host", "0.0.0.0")
    assert done.returncode == 1 and "refusing to serve on '0.0.0.0' with no API key" in done.stderr
    done = _corral("serve", "--config", str(path), "--port", "70000")
    assert done.returncode == 1 and "--port: must be 0..65535" in done.stderr


async def test_port_on_the_command_line_wins_and_a_reload_keeps_it(tmp_path: Path) -> None:
    path = write_config(tmp_path / "config.toml", {"a": {}}, {"port": 1})  # a port nobody may bind
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(serve, load(path), worker_command=WORKER_COMMAND, server_overrides={"port": 0})
            )
            assert binds[0].startswith("http://127.0.0.1:") and not binds[0].endswith(":1")
            async with httpx.AsyncClient(base_url=binds[0], timeout=10) as c:
                r = await c.post("/admin/reload")
                assert r.status_code == 200
                assert r.json()["needs_restart"] == []  # the override is not a change
            nursery.cancel_scope.cancel()


def _held_port() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_a_port_in_use_is_one_line_naming_the_address_and_the_way_out(tmp_path: Path) -> None:
    """Issue 41, item 1: a busy port was about sixty lines of nested ExceptionGroup, printed
    after the supervisor had started; now it is one line, before anything starts."""
    path = write_config(tmp_path / "config.toml", {"a": {}})
    with _held_port() as holder:
        port = holder.getsockname()[1]
        done = _corral("serve", "--config", str(path), "--port", str(port))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}: the port is already in use" in lines[0]
    assert "--port N" in lines[0] and str(path) in lines[0]
    assert "Traceback" not in done.stderr and not done.stdout


async def test_serve_binds_before_any_worker_starts(tmp_path: Path) -> None:
    """The second address failing closes the first, and serve() raises before its nursery
    (and so the supervisor) starts: nothing is left listening."""
    path = write_config(tmp_path / "config.toml", {"a": {}})
    with _held_port() as holder:
        port = holder.getsockname()[1]
        cfg = load(path, {"host": ["127.0.0.2", "127.0.0.1"], "port": port})
        with pytest.raises(CannotListen, match=rf"127\.0\.0\.1:{port}"):
            await serve(cfg, worker_command=WORKER_COMMAND)
    with socket.socket() as again:  # 127.0.0.2:port was released
        again.bind(("127.0.0.2", port))


def test_make_serve_passes_port_and_host(tmp_path: Path) -> None:
    """`make serve PORT=n HOST=a` reaches `corral serve`: with a port held, make's run ends in
    Corral's one line about that port and host."""
    root = Path(__file__).resolve().parents[2]
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    ready = subprocess.run(["make", "-q", "setup", "model"], cwd=root, capture_output=True)
    if ready.returncode != 0:
        pytest.skip("the checkout's venv or demo model is not built (make setup model)")
    with _held_port() as holder:
        port = holder.getsockname()[1]
        done = subprocess.run(
            ["make", "--no-print-directory", "serve", f"PORT={port}", "HOST=127.0.0.1"],
            cwd=root, capture_output=True, text=True, timeout=60,
        )
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}: the port is already in use" in done.stderr
