"""A model's handle: the one owner of its worker and its lifecycle state.

`run()` is the single writer of `state`: it starts the worker when asked, serves until the
worker dies or the model has been idle for `idle_timeout`, then stops it. Everyone else is
a client that calls `lease()`, which never branches on a state it read earlier: it either
takes the ready worker in the same scheduler tick that it checked it (so an idle stop cannot
slip in between), or waits on the shared load attempt and looks again.
"""

from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Sequence

import trio

from supervisor.config import ModelSpec, SupervisorConfig
from supervisor.connection import LoadFailed, WorkerConnection, open_worker, stop_worker, worker_spec
from supervisor.errors import WorkerCrashed, WorkerUnavailable
from supervisor.lifecycle import State, check
from worker.protocol import Ping

log = logging.getLogger("corral.supervisor")


@dataclass(eq=False)
class _Attempt:
    """One load that every waiter shares; a failed load fails all of them."""

    done: trio.Event = field(default_factory=trio.Event)
    error: WorkerUnavailable | None = None

    def finish(self, error: WorkerUnavailable | None = None) -> None:
        self.error = error
        self.done.set()


class Lease:
    """A request's hold on a ready worker. `release()` is idempotent and never blocks, so it
    is safe in a `finally` that runs during cancellation."""

    def __init__(self, handle: ModelHandle, conn: WorkerConnection) -> None:
        self.handle, self.conn = handle, conn
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.handle._release()


class ModelHandle:
    def __init__(
        self, spec: ModelSpec, settings: SupervisorConfig, worker_command: Sequence[str]
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.worker_command = list(worker_command)
        self.state = State.STOPPED
        self.conn: WorkerConnection | None = None
        self.in_flight = 0
        self.last_used: float = 0.0  # trio clock, end of the last inference request
        self.starts = 0
        self.crashes = 0
        self.failures = 0  # failed starts in a row; reset by a worker that stays up min_uptime
        self.last_error: str | None = None
        self.load_seconds: float | None = None
        self._attempt: _Attempt | None = None
        self._wakeup = trio.Event()
        self._shutdown = False
        self._unload: str | None = None  # "drain" or "force" while an unload runs
        self._unload_reason = ""
        self._next_spec: ModelSpec | None = None  # from a reload, adopted once stopped
        self._retire = False  # removed from the config: stop for good
        self.last_used_wall: float | None = None  # time.time() of the last request's end
        self._load_scope: trio.CancelScope | None = None
        self.finished = trio.Event()  # set when run() has returned

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        c = self.conn
        return c.process.pid if c is not None and c.process is not None else None

    # ---- clients --------------------------------------------------------------------------

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[WorkerConnection]:
        """`acquire()` for the duration of a block."""
        held = await self.acquire()
        try:
            yield held.conn
        finally:
            held.release()

    async def acquire(self) -> Lease:
        """The ready worker, counted in flight until `release()`.

        Blocks while the model loads (every concurrent caller shares one load). Raises
        WorkerUnavailable if the load fails. Cancelling the wait leaves the load running for
        others. While a lease is held the worker is never stopped for idleness. A streaming
        response holds its lease past the handler that took it, hence no context manager.
        """
        return Lease(self, await self._acquire())

    def _release(self) -> None:
        self.in_flight -= 1
        self.last_used = trio.current_time()
        self.last_used_wall = time.time()
        self._poke()

    def request_unload(self, force: bool = False, reason: str = "unloaded by an admin") -> None:
        """Stop the worker once nothing is in flight (state DRAINING meanwhile); with
        `force`, cancel what is in flight first. Never blocks. A request that arrives
        meanwhile waits for the stop and then loads the model again."""
        if self.state in (State.STARTING, State.READY, State.DRAINING):
            self._unload = "force" if force or self._unload == "force" else "drain"
            self._unload_reason = reason
            self._poke()

    def respec(self, spec: ModelSpec) -> None:
        """Adopt a changed config (reload). Without a worker, at once; otherwise the worker
        drains, stops, and the next start uses the new spec. Never blocks."""
        if self.state in (State.STOPPED, State.BACKOFF, State.FAILED):
            self.spec = spec
            self.reset()
            self.failures = 0
        else:
            self._next_spec = spec
            self.request_unload(reason="config changed")

    def retire(self) -> None:
        """The model left the config (reload): drain, stop, and end the run loop."""
        self._retire = True
        self.request_unload(reason="removed from the config")
        self._poke()

    async def _acquire(self) -> WorkerConnection:
        while True:
            if self.state is State.FAILED:
                raise self._failed_error()
            conn = self.conn
            if self.state is State.READY and conn is not None and not conn.closed.is_set():
                # No await between the check and the increment: the run loop sees in_flight
                # before it can decide to stop.
                self.in_flight += 1
                return conn
            if self._attempt is None:
                self._attempt = _Attempt()
                self._poke()
            attempt = self._attempt
            await attempt.done.wait()
            if attempt.error is not None:
                raise attempt.error

    # ---- the single writer ----------------------------------------------------------------

    def _poke(self) -> None:
        self._wakeup.set()

    async def _sleep_until_poked(self) -> None:
        await self._wakeup.wait()
        self._wakeup = trio.Event()

    def _set(self, new: State, reason: str) -> None:
        check(self.state, new)
        log.info("%s: %s -> %s (%s)", self.name, self.state.value, new.value, reason)
        self.state = new

    def request_shutdown(self) -> None:
        """Ask the run loop to stop the worker gracefully and return. Never blocks; wait on
        `finished`. A load in progress is abandoned; its waiters get WorkerUnavailable."""
        self._shutdown = True
        if self._load_scope is not None:
            self._load_scope.cancel()
        self._poke()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own this model until `request_shutdown()` (graceful: the worker gets a Shutdown
        frame) or cancellation (hard: the worker is killed with its nursery)."""
        task_status.started()
        if self.spec.preload:
            self._attempt = _Attempt()  # nobody waits on it; the model just loads
        try:
            while not self._shutdown:
                if self._retire and self.state in (State.STOPPED, State.FAILED):
                    return
                if self._next_spec is not None and self.state is State.STOPPED:
                    self.spec, self._next_spec = self._next_spec, None
                if self.state is State.FAILED or self._attempt is None:
                    await self._sleep_until_poked()  # a request, a reset, or shutdown
                    continue
                await self._lifetime(self._attempt)
                if self.state is State.BACKOFF:
                    await self._backoff()
        finally:
            if self._attempt is not None:
                self._attempt.finish(WorkerUnavailable(f"model {self.name!r} is shutting down"))
                self._attempt = None
            self.finished.set()

    async def _lifetime(self, attempt: _Attempt) -> None:
        """One worker, from spawn to exit."""
        self._set(State.STARTING, "requested")
        self.starts += 1
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            conn: WorkerConnection | None = None
            try:
                with trio.CancelScope() as self._load_scope:
                    with trio.fail_after(self.settings.start_timeout or float("inf")):
                        conn = await open_worker(
                            nursery, worker_spec(self.spec), self.worker_command, self._poke
                        )
            except (LoadFailed, trio.TooSlowError, OSError) as exc:
                msg = (
                    f"no Ready within start_timeout={self.settings.start_timeout:g}s"
                    if isinstance(exc, trio.TooSlowError)
                    else str(exc)
                )
                self._load_failed(attempt, msg)
                nursery.cancel_scope.cancel()
                return
            except BaseException:
                # Hard shutdown: the Cancelled comes out of open_worker's nurseries wrapped
                # in a BaseExceptionGroup, which `except trio.Cancelled` would not catch.
                self._set(State.STOPPING, "cancelled during load")
                self._set(State.STOPPED, "cancelled")
                raise
            finally:
                self._load_scope = None
            if conn is None:  # request_shutdown() abandoned the load
                self._set(State.STOPPING, "shutdown during load")
                nursery.cancel_scope.cancel()  # kills the half-loaded worker
                self._set(State.STOPPED, "shutdown")
                return
            self.conn = conn
            self.load_seconds = trio.current_time() - started
            self.last_used = ready_at = trio.current_time()
            self._set(State.READY, f"loaded in {self.load_seconds:.1f}s, pid {self.pid}")
            self._attempt = None
            attempt.finish()
            nursery.start_soon(self._watch_health, conn)
            try:
                reason = await self._serve(conn)
                stable = trio.current_time() - ready_at >= self.settings.min_uptime
                if stable:
                    self.failures = 0
                if conn.closed.is_set():
                    self.crashes += 1
                    self.last_error = conn.close_reason
                    if stable or self.state is State.DRAINING:
                        self._set(State.STOPPED, reason)  # restarted by the next request
                    else:
                        self._failed_start(f"{reason} within min_uptime")
                else:
                    await self._stop(conn, reason)
            finally:
                if self.state in (State.READY, State.DRAINING, State.STOPPING):
                    # Hard cancellation: the worker's tasks are cancelled with this nursery
                    # and its process is killed; only the bookkeeping is left.
                    if self.state in (State.READY, State.DRAINING):
                        self._set(State.STOPPING, "cancelled")
                    self._set(State.STOPPED, "killed")
                self.conn = None
                # An unload asked for during the load applied to this worker; it is done.
                self._unload = None
                nursery.cancel_scope.cancel()

    def _load_failed(self, attempt: _Attempt, msg: str) -> None:
        self.last_error = msg
        self._failed_start(f"load failed: {msg}")

    def _failed_start(self, reason: str) -> None:
        """A load that failed, or a worker that died before min_uptime: back off, or give up
        after start_retries. Waiters keep waiting through a backoff (their own deadline
        bounds them); on FAILED they all get a 503 that says not to retry."""
        self.failures += 1
        retries = self.settings.start_retries
        if self.failures > retries:
            self._set(State.FAILED, f"{reason}; {self.failures} failed starts in a row")
            if self._attempt is not None:
                self._attempt.finish(self._failed_error())
                self._attempt = None
        else:
            self._set(State.BACKOFF, f"{reason}; retry {self.failures}/{retries} in {self._backoff_delay():g}s")

    def _failed_error(self) -> WorkerUnavailable:
        return WorkerUnavailable(
            f"model {self.name!r} failed to start {self.failures} times in a row "
            f"(last error: {self.last_error}); it stays unavailable until a reset or a "
            f"config reload",
            retry=False,
        )

    def _backoff_delay(self) -> float:
        s = self.settings
        return float(min(s.backoff_base * 2 ** (self.failures - 1), s.backoff_max))

    async def _backoff(self) -> None:
        """Wait out the backoff delay (only shutdown cuts it short), then start again if a
        request is waiting, or rest in STOPPED until one arrives."""
        with trio.move_on_after(self._backoff_delay()):
            while not (self._shutdown or self._retire):
                await self._sleep_until_poked()
        if self._shutdown or self._retire or self._attempt is None:
            self._set(State.STOPPED, "stopping" if self._shutdown or self._retire else "backoff over, no request waiting")
        # else: run() calls _lifetime, which goes BACKOFF -> STARTING

    def reset(self) -> bool:
        """FAILED -> STOPPED, so the next request tries again. False if not FAILED."""
        if self.state is not State.FAILED:
            return False
        self.failures = 0
        self._set(State.STOPPED, "reset")
        self._poke()
        return True

    async def _serve(self, conn: WorkerConnection) -> str:
        """Wait in READY until the worker dies, the model has been idle long enough, or an
        unload has drained it."""
        idle_timeout = 0.0 if self.spec.pinned else self.spec.idle_timeout
        while True:
            if conn.closed.is_set():
                return f"worker died: {conn.close_reason}"
            if self._shutdown:
                return "shutdown"
            if self._unload is not None:
                if self._unload == "force" and self.in_flight:
                    conn.cancel_all(f"the model was {self._unload_reason} (force)")
                if self.in_flight == 0:
                    return self._unload_reason
                if self.state is State.READY:
                    self._set(
                        State.DRAINING,
                        f"{self._unload_reason}: waiting for {self.in_flight} request(s)",
                    )
                await self._sleep_until_poked()
            elif self.in_flight == 0 and idle_timeout > 0:
                deadline = self.last_used + idle_timeout
                if trio.current_time() >= deadline:
                    return f"idle for {idle_timeout:g}s"
                with trio.move_on_at(deadline):
                    await self._sleep_until_poked()
            else:
                await self._sleep_until_poked()

    async def _watch_health(self, conn: WorkerConnection) -> None:
        """Ping every health_interval; kill a worker silent for health_misses intervals.

        The worker answers pings from its event loop, not its decode thread, so a long
        decode step does not count as a miss. Detection takes at most
        health_interval * (health_misses + 1). The kill closes the connection, and the run
        loop then handles it like any crash.
        """
        interval = self.settings.health_interval
        if interval <= 0:
            return
        limit = interval * self.settings.health_misses
        seq = 0
        while not conn.closed.is_set():
            await trio.sleep(interval)
            silent = trio.current_time() - conn.last_pong
            if silent > limit:
                log.warning("%s: no answer to pings for %.1fs; killing pid %s as hung", self.name, silent, self.pid)
                conn.kill(f"worker hung: no answer to pings for {silent:.1f}s")
                return
            seq += 1
            try:
                conn.send(Ping(seq=seq))
            except WorkerCrashed:
                return

    async def _stop(self, conn: WorkerConnection, reason: str) -> None:
        self._set(State.STOPPING, reason)
        await stop_worker(conn, self.settings.stop_grace)
        self._set(State.STOPPED, "worker exited")
