"""`corral --version`, and `corral serve --host/--port` over the file's [server]."""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from importlib.metadata import version
from pathlib import Path

import httpx
import trio

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
