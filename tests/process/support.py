"""Helpers for the process tests: configs, a running supervisor, the fake worker's start log."""

from __future__ import annotations

import json
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Callable

import psutil
import trio

from supervisor.config import Config, parse
from supervisor.connection import RequestStream, WorkerConnection
from supervisor.supervisor import Supervisor
from worker.protocol import SamplingParams, TokenEvent

FAKE_WORKER = Path(__file__).resolve().parent.parent / "fake_worker.py"
WORKER_COMMAND = [sys.executable, str(FAKE_WORKER)]


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def make_config(
    tmp_path: Path, models: dict[str, dict[str, object]], **supervisor: object
) -> Config:
    """A parsed config whose models all point at one empty dummy file in tmp_path."""
    dummy = tmp_path / "dummy.gguf"
    dummy.touch()
    lines = ["[supervisor]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in supervisor.items()]
    for name, fields in models.items():
        lines.append(f"[models.{json.dumps(name)}]")
        lines.append('path = "dummy.gguf"')
        lines += [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
    return parse("\n".join(lines) + "\n", tmp_path)


def make_supervisor(
    tmp_path: Path, models: dict[str, dict[str, object]], **settings: object
) -> Supervisor:
    return Supervisor(make_config(tmp_path, models, **settings), worker_command=WORKER_COMMAND)


@asynccontextmanager
async def running(sup: Supervisor) -> AsyncIterator[Supervisor]:
    """Run the supervisor for the duration of the block; leaving it stops the supervisor
    gracefully (Supervisor.stop), as corral serve does on SIGTERM."""
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        try:
            yield sup
        finally:
            with trio.move_on_after(10):
                await sup.stop()
            nursery.cancel_scope.cancel()


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
