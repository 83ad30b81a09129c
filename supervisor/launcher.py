"""Starting and stopping worker processes.

`open_worker` spawns `python -m worker` with one end of a socketpair passed through
`pass_fds`, starts the connection's reader and writer tasks in the caller's nursery, and
returns once the worker has sent Ready. `stop_worker` asks it to finish, then escalates.
The handle goes through a Launcher, so that the lifecycle tests can start in-process
workers under trio's virtual clock instead.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import sys
from typing import Callable, Protocol, Sequence

import msgspec
import trio

from supervisor.config import ModelSpec
from supervisor.connection import WorkerConnection
from supervisor.errors import WorkerCrashed
from supervisor.systemd import child_environment
from worker.protocol import Shutdown, WorkerSpec, options_of

log = logging.getLogger("corral.worker")


class LoadFailed(Exception):
    pass


def worker_spec(spec: ModelSpec, threads: int | None = None, cache_bytes: int | None = None) -> WorkerSpec:
    """What the worker needs to know of a model's config; `threads` overrides the
    config's (the supervisor's share of the cores when the config sets none), and
    `cache_bytes` its prompt_cache_bytes (its share of prompt_cache_budget)."""
    options = options_of(spec)
    if threads is not None:
        options["threads"] = threads
    if cache_bytes is not None:
        options["prompt_cache_bytes"] = cache_bytes
    return WorkerSpec(name=spec.name, path=str(spec.path), **options)


async def open_worker(
    nursery: trio.Nursery,
    spec: WorkerSpec,
    command: Sequence[str],
    on_close: Callable[[], None],
    on_progress: Callable[[float], None] | None = None,
) -> WorkerConnection:
    """Spawn a worker in `nursery` and wait until it is Ready; `on_progress` hears each
    Loading frame's progress.

    Raises LoadFailed if the worker reports Failed or exits first. Cancellation (the caller's
    start timeout) kills the process: the nursery owns it.
    """
    parent, child = socket.socketpair()
    try:
        argv = [*command, "--fd", str(child.fileno()), "--spec", msgspec.json.encode(spec).decode()]
        process: trio.Process = await nursery.start(
            _run_process, argv, child.fileno()
        )
    finally:
        child.close()  # the worker holds its own copy; ours would hide its EOF
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(parent))
    conn = WorkerConnection(spec.name, stream, on_close, on_progress)
    conn.persists = spec.prompt_cache_dir is not None and not spec.embeddings
    conn.process = process
    nursery.start_soon(conn.reader)
    nursery.start_soon(conn.writer)
    nursery.start_soon(_watch_exit, conn, process)
    await wait_until_ready(conn)
    if conn.ready is None:
        code = await _exit_code(process)
        raise LoadFailed(conn.failed_message or f"worker exited during load (exit code {code})")
    return conn


async def wait_until_ready(conn: WorkerConnection) -> None:
    """Return when the worker has sent Ready or its connection has closed, whichever is
    first; the caller tells them apart by `conn.ready`."""
    async with trio.open_nursery() as wait:

        async def until_ready() -> None:
            await conn.ready_event.wait()
            wait.cancel_scope.cancel()

        async def until_closed() -> None:
            await conn.closed.wait()
            wait.cancel_scope.cancel()

        wait.start_soon(until_ready)
        wait.start_soon(until_closed)


async def _run_process(
    argv: list[str], fd: int, *, task_status: trio.TaskStatus[trio.Process]
) -> None:
    # check=False: a worker's exit status is information for the handle, not an exception
    # that would tear down the nursery. stdin is closed so a worker never reads the terminal.
    await trio.run_process(
        argv,
        pass_fds=(fd,),
        stdin=subprocess.DEVNULL,
        check=False,
        env=child_environment(),  # only the main process may notify systemd
        task_status=task_status,
        deliver_cancel=_kill,
    )


async def _kill(process: trio.Process) -> None:
    """Cancellation kills outright: graceful stops happen before the nursery is cancelled."""
    with contextlib.suppress(ProcessLookupError):
        process.kill()


async def _watch_exit(conn: WorkerConnection, process: trio.Process) -> None:
    code = await process.wait()
    # EOF on the socket usually arrives first; this catches a worker whose socket a
    # grandchild still holds open.
    conn.close(f"worker exited with code {_describe(code)}")


async def _exit_code(process: trio.Process) -> str:
    with trio.move_on_after(2.0):
        return _describe(await process.wait())
    return "unknown"


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


WORKER_PERSIST_SECONDS = 10.0


async def stop_worker(conn: WorkerConnection, grace: float) -> None:
    """Ask the worker to finish and exit; SIGTERM, then SIGKILL if it will not.

    Shielded by the caller when it runs during cancellation.
    """
    process = conn.process
    if process is None or process.returncode is not None:
        return
    try:
        conn.send(Shutdown(grace=grace))
    except WorkerCrashed:
        pass
    # A worker with a prompt cache folder writes its hottest saved prompts there after the
    # last request (worker/link.py, PERSIST_SECONDS), then exits.
    with trio.move_on_after(grace + 1.0 + (WORKER_PERSIST_SECONDS if conn.persists else 0.0)):
        await process.wait()
        return
    log.warning("%s: worker did not exit after Shutdown; sending SIGTERM", conn.name)
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    with trio.move_on_after(grace):
        await process.wait()
        return
    log.warning("%s: worker ignored SIGTERM; sending SIGKILL", conn.name)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()


def default_worker_command() -> list[str]:
    # -P: `-m` would put the current folder first on the import path, so a `worker/`
    # folder wherever `corral serve` was started from would run in place of ours.
    return [sys.executable, "-P", "-m", "worker"]


class Launcher(Protocol):
    """How a handle gets a worker. The supervisor uses ProcessLauncher; the lifecycle tests
    use an in-process one, so that timing logic runs under trio's virtual clock."""

    async def start(
        self, nursery: trio.Nursery, spec: WorkerSpec, on_close: Callable[[], None],
        on_progress: Callable[[float], None] | None = None,
    ) -> WorkerConnection:
        """A Ready worker whose tasks live in `nursery`, which told `on_progress` of its
        load's progress on the way; raises LoadFailed."""
        ...

    async def stop(self, conn: WorkerConnection, grace: float) -> None:
        """Stop it gracefully, escalating as needed; return once it is gone."""
        ...


class ProcessLauncher:
    """Workers as child processes (`python -m worker`, or a test's fake worker)."""

    def __init__(self, command: Sequence[str] | None = None) -> None:
        self.command = list(command or default_worker_command())

    async def start(
        self, nursery: trio.Nursery, spec: WorkerSpec, on_close: Callable[[], None],
        on_progress: Callable[[float], None] | None = None,
    ) -> WorkerConnection:
        return await open_worker(nursery, spec, self.command, on_close, on_progress)

    async def stop(self, conn: WorkerConnection, grace: float) -> None:
        await stop_worker(conn, grace)
