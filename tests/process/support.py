"""Helpers for the process tests: configs, a running supervisor, the fake worker's start log."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import AsyncIterator, Callable

import psutil
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve

from router.app import create_app
from tests.harness import make_config, running  # noqa: F401  (re-exported)
from supervisor.connection import RequestStream, WorkerConnection
from supervisor.supervisor import Supervisor
from worker.protocol import SamplingParams, TokenEvent

FAKE_WORKER = Path(__file__).resolve().parent.parent / "fake_worker.py"
WORKER_COMMAND = [sys.executable, str(FAKE_WORKER)]


def make_supervisor(
    tmp_path: Path, models: dict[str, dict[str, object]], cores: int | None = None, **settings: object
) -> Supervisor:
    config = make_config(tmp_path, models, **settings)
    return Supervisor(config, worker_command=WORKER_COMMAND, cores=cores)


async def wait_for(predicate: Callable[[], bool], timeout: float, what: str = "condition") -> None:
    """Poll until predicate() is true; fail the test after `timeout` seconds."""
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def collect(stream: RequestStream) -> tuple[str, TokenEvent]:
    """Read a stream to its final event; returns the whole text and the final event."""
    parts: list[str] = []
    last: TokenEvent | None = None
    try:
        async for ev in stream:
            parts.append(ev.text)
            last = ev
    finally:
        stream.close()
    assert last is not None and last.finish_reason is not None
    return "".join(parts), last


async def generate(
    conn: WorkerConnection, max_tokens: int = 3, prompt: str = "hello"
) -> tuple[str, TokenEvent]:
    return await collect(conn.generate(SamplingParams(max_tokens=max_tokens), prompt=prompt))


def expected_text(n: int) -> str:
    """What the fake worker generates in n tokens."""
    return " ".join(f"tok{i}" for i in range(n))


def alive(pid: int) -> bool:
    """True if `pid` is a running (not zombie) fake worker."""
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and any("fake_worker" in a for a in p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class StartLog:
    """The fake worker's FAKE_START_LOG: one "<model> <pid>" line per process start."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[tuple[str, int]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            name, pid = line.rsplit(" ", 1)
            out.append((name, int(pid)))
        return out

    def names(self) -> list[str]:
        return [name for name, _ in self.entries()]

    def pids(self, name: str | None = None) -> list[int]:
        return [pid for n, pid in self.entries() if name is None or n == name]


@asynccontextmanager
async def serving_http(sup: Supervisor, **hypercorn: object) -> AsyncIterator[str]:
    """The supervisor running and the real app served by hypercorn on a free loopback port,
    for the length of the block; yields the base URL. `hypercorn` sets Config attributes."""
    hc = HyperConfig()
    hc.bind = ["127.0.0.1:0"]
    for key, value in hypercorn.items():
        setattr(hc, key, value)
    stop = trio.Event()
    async with running(sup), trio.open_nursery() as nursery:
        binds = await nursery.start(
            partial(serve, create_app(sup, sup.config), hc, shutdown_trigger=stop.wait)
        )
        try:
            yield binds[0]
        finally:
            stop.set()
            nursery.cancel_scope.cancel()


async def corral(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    """Run the CLI with a clean slate of CORRAL_* variables (the test's own `env` on top),
    from `cwd`, so that no config of the machine's search path is found by accident."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    base.update(HOME=str(cwd), XDG_CONFIG_HOME=str(cwd / "xdg"), COLUMNS="200")
    base.update(env)
    return await trio.run_process(
        [sys.executable, "-m", "corral", *args], cwd=cwd, env=base, check=False,
        capture_stdout=True, capture_stderr=True,
    )


def out(done: subprocess.CompletedProcess[bytes]) -> str:
    return done.stdout.decode()


def err(done: subprocess.CompletedProcess[bytes]) -> str:
    return done.stderr.decode()
