"""A model's handle: the one owner of its worker and its lifecycle state.

`run()` is the single writer of `state`: it starts the worker when asked, serves until the
worker dies or the model has been idle for `idle_timeout`, then stops it. Everyone else is
a client that calls `lease()`, which never branches on a state it read earlier: it either
takes the ready worker in the same scheduler tick that it checked it (so an idle stop cannot
slip in between), or waits on the shared load attempt and looks again.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import trio

import psutil

from supervisor.admission import Admission
from supervisor.capacity import Resident
from supervisor.config import ModelSpec, SupervisorConfig
from supervisor.connection import WorkerConnection
from supervisor.launcher import Launcher, LoadFailed, worker_spec
from supervisor.errors import WorkerCrashed, WorkerUnavailable
from supervisor import health
from supervisor.gguf_meta import estimate_bytes
from supervisor.lifecycle import State, check
from supervisor.stats import ModelStats
from worker.protocol import SetThreads

log = logging.getLogger("corral.supervisor")

# The states in which a model holds memory and CPU: from spawn until its process is gone.
HOLDING = (State.STARTING, State.READY, State.DRAINING, State.STOPPING)
# How long a client that gave up waiting for room is told to wait before trying again.
QUEUE_RETRY_AFTER = 5.0


def process_rss(pid: int | None) -> int | None:
    """Resident memory of a process, or None when there is none (or it just exited)."""
    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


@dataclass(eq=False)
class _Attempt:
    """One load that every waiter shares; a failed load fails all of them.

    It is wanted while a request waits on it, or until `keep_until` (trio clock) for a
    load that nobody waits on (preload). An unwanted attempt leaves the load queue.
    """

    done: trio.Event = field(default_factory=trio.Event)
    error: WorkerUnavailable | None = None
    waiters: int = 0
    keep_until: float = 0.0

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
        self,
        spec: ModelSpec,
        settings: SupervisorConfig,
        launcher: Launcher,
        admission: Admission | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.launcher = launcher
        self.admission = admission
        # Called after every state change and every finished request: the supervisor
        # re-plans capacity and re-divides the cores.
        self.on_change: Callable[[], None] = on_change or (lambda: None)
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
        self._hung = False  # its worker was killed for missing pings: replace it at once
        self.last_used_wall: float | None = None  # time.time() of the last request's end
        self._load_scope: trio.CancelScope | None = None
        self.finished = trio.Event()  # set when run() has returned
        self._state_changed = trio.Event()
        self._queue_scope: trio.CancelScope | None = None
        self._backoff_until = 0.0
        self.rss: int | None = None  # the worker's resident memory, measured while it runs
        self._estimate: tuple[ModelSpec, int] | None = None
        self.threads: int | None = None  # the share of the cores given by the supervisor
        self.worker_threads: int | None = None  # what the running worker was told to use

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        c = self.conn
        return c.process.pid if c is not None and c.process is not None else None

    def statistics(self) -> ModelStats:
        """This model's numbers now, as one frozen snapshot."""
        pid, conn = self.pid, self.conn
        ready = conn.ready if conn is not None else None
        pong = conn.stats if conn is not None else None
        return ModelStats(
            name=self.name,
            aliases=tuple(self.spec.aliases),
            state=self.state,
            pid=pid,
            rss_bytes=process_rss(pid),
            slots=ready.slots if ready is not None else self.spec.slots,
            slots_busy=conn.active if conn is not None else 0,
            queued=conn.queued if conn is not None else 0,
            in_flight=self.in_flight,
            last_used=self.last_used_wall,
            load_seconds=self.load_seconds,
            restarts=max(self.starts - 1, 0),
            last_error=self.last_error,
            pinned=self.spec.pinned,
            cost_bytes=self.cost(),
            threads=(pong.threads or None) if pong is not None else self.worker_threads,
        )

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

    async def ensure_ready(self) -> None:
        """Load the model if it is not loaded, and return once it is ready. Raises like
        `acquire()`; counts as a use for the idle timer."""
        (await self.acquire()).release()

    def _release(self) -> None:
        self.in_flight -= 1
        self.last_used = trio.current_time()
        self.last_used_wall = time.time()
        self._poke()
        self.on_change()  # an idle model may now be evicted

    def request_unload(self, force: bool = False, reason: str = "unloaded by an admin") -> None:
        """Stop the worker once nothing is in flight (state DRAINING meanwhile); with
        `force`, cancel what is in flight first. Never blocks. A request that arrives
        meanwhile waits for the stop and then loads the model again."""
        if self.state in (State.STARTING, State.READY, State.DRAINING):
            self._unload = "force" if force or self._unload == "force" else "drain"
            self._unload_reason = reason
            self._poke()

    def respec(self, spec: ModelSpec) -> None:
        """Adopt a model's settings from a reload. Never blocks.

        Without a worker, at once. A worker that runs other settings drains, stops, and
        the next start uses these. A worker that already runs these settings keeps running,
        and a restart still pending from an earlier reload is cancelled: the comparison is
        with what the worker runs, not with the last file, so a reload that restores a
        model's settings undoes the restart an intermediate file asked for.
        """
        if self.state in (State.STOPPED, State.BACKOFF, State.FAILED):
            self.spec = spec
            self._next_spec = None
            self.reset()
            self.failures = 0
        else:
            self._next_spec = None if spec == self.spec else spec
            self._poke()

    def retire(self) -> None:
        """The model left the config (reload): drain, stop, and end the run loop."""
        self._retire = True
        self._poke()

    def unretire(self) -> bool:
        """A reload put the model back before its run loop ended: it stays, and a worker
        still draining keeps serving. False when the run loop has already ended."""
        if self.finished.is_set():
            return False
        self._retire = False
        self._poke()
        return True

    def _leave_reason(self) -> str | None:
        """Why the running worker should stop once nothing is in flight, or None."""
        if self._unload is not None:
            return self._unload_reason
        if self._retire:
            return "removed from the config"
        if self._next_spec is not None:
            return "config changed"
        return None

    async def _acquire(self) -> WorkerConnection:
        # The deadline bounds waiting on a model that is not loading: queued for room,
        # backing off, or still stopping from an unload. A load in progress is bounded by
        # start_timeout instead, so a slow large model is not cut short.
        deadline = trio.current_time() + self.settings.load_wait
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
            attempt.waiters += 1
            try:
                with trio.move_on_at(math.inf if self.state is State.STARTING else deadline):
                    await self._state_changed.wait()  # also set when the attempt finishes
            finally:
                attempt.waiters -= 1
                if attempt.waiters == 0:  # a queued load nobody waits for leaves the queue
                    self._poke()
                    self.on_change()
            if attempt.done.is_set() and attempt.error is not None:
                raise attempt.error
            if trio.current_time() >= deadline and self.state not in (State.STARTING, State.READY):
                raise self._gave_up()

    def wanted(self) -> bool:
        """Does anyone still want the pending load? (False when there is none.)"""
        a = self._attempt
        if a is None or self._shutdown or self._retire:
            return False
        return a.waiters > 0 or trio.current_time() < a.keep_until

    def _gave_up(self) -> WorkerUnavailable:
        wait = self.settings.load_wait
        if self.state is State.BACKOFF:
            left = max(self._backoff_until - trio.current_time(), 1.0)
            return WorkerUnavailable(
                f"model {self.name!r} is backing off after {self.failures} failed start(s) "
                f"(last error: {self.last_error}); the next try is in {left:.0f}s",
                retry_after=left,
            )
        why = self.admission.waiting_reason(self) if self.admission is not None else None
        if why is not None:
            return WorkerUnavailable(f"{why} (waited load_wait = {wait:g}s)", retry_after=QUEUE_RETRY_AFTER)
        return WorkerUnavailable(
            f"model {self.name!r} did not become ready within load_wait = {wait:g}s "
            f"(it is {self.state.value})",
            retry_after=QUEUE_RETRY_AFTER,
        )

    # ---- capacity ---------------------------------------------------------------------------

    @property
    def holds_memory(self) -> bool:
        return self.state in HOLDING

    @property
    def leaving(self) -> bool:
        """Unloading already: its memory frees without anyone evicting it."""
        return self.state in (State.DRAINING, State.STOPPING) or self._leave_reason() is not None

    def cost(self) -> int:
        """Bytes this model holds or will hold: its worker's RSS once measured, otherwise
        the estimate from its file."""
        if self.rss is not None and self.state in (State.READY, State.DRAINING, State.STOPPING):
            return max(self.rss, 1)
        return self.estimated_cost()

    def estimated_cost(self) -> int:
        """The GGUF file's size plus its KV cache for n_ctx cells, read once per config.
        Reading stops at the last key it needs, a few hundred bytes in, so it is done
        inline."""
        spec = self.spec
        if self._estimate is None or self._estimate[0] is not spec:
            try:
                n = estimate_bytes(spec.path, spec.n_ctx)
            except OSError:
                n = 0
            self._estimate = (spec, n)
        return self._estimate[1]

    def resident(self) -> Resident:
        return Resident(
            name=self.name,
            cost=self.cost(),
            last_used=self.last_used,
            evictable=(
                self.state is State.READY and self.in_flight == 0 and not self.spec.pinned
                and not self.leaving
            ),
            leaving=self.leaving,
        )

    def _measure(self) -> None:
        rss = process_rss(self.pid)
        if rss is not None:
            self.rss = rss

    def assign_threads(self, n: int | None) -> None:
        """The supervisor's share of the cores for this model (None: it has its own
        `threads`). A running worker is told at once; a loading one when it is ready."""
        self.threads = n
        conn = self.conn
        if (
            n is not None and n != self.worker_threads and conn is not None
            and conn.ready is not None and self.state in (State.READY, State.DRAINING)
        ):
            try:
                conn.send(SetThreads(n_threads=n))
                self.worker_threads = n
            except WorkerCrashed:
                pass

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
        self._announce()
        self.on_change()

    def _announce(self) -> None:
        """Wake every waiter: the state changed or the load attempt finished."""
        self._state_changed.set()
        self._state_changed = trio.Event()

    async def wait_for_state(self, *states: State) -> None:
        """Return once the model is in one of `states` (at once if it already is)."""
        while self.state not in states:
            await self._state_changed.wait()

    def request_shutdown(self) -> None:
        """Ask the run loop to stop the worker gracefully and return. Never blocks; wait on
        `finished`. A load in progress is abandoned; its waiters get WorkerUnavailable."""
        self._shutdown = True
        for scope in (self._load_scope, self._queue_scope):
            if scope is not None:
                scope.cancel()
        self._poke()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own this model until `request_shutdown()` (graceful: the worker gets a Shutdown
        frame) or cancellation (hard: the worker is killed with its nursery)."""
        task_status.started()
        if self.spec.preload:
            # Nobody waits on a preload; it keeps its place in the load queue for as long
            # as a request would.
            self._want_for(self.settings.load_wait)
        try:
            while not self._shutdown:
                if self._retire and self.state in (State.STOPPED, State.FAILED):
                    return
                if self._next_spec is not None and self.state is State.STOPPED:
                    self.spec, self._next_spec = self._next_spec, None
                if self.state is State.FAILED or self._attempt is None:
                    await self._sleep_until_poked()  # a request, a reset, or shutdown
                    continue
                if not await self._admitted():
                    continue
                await self._lifetime(self._attempt)
                if self.state is State.BACKOFF:
                    await self._backoff()
        finally:
            if self._attempt is not None:
                self._attempt.finish(WorkerUnavailable(f"model {self.name!r} is shutting down"))
                self._attempt = None
                self._announce()
            self.finished.set()

    def _want_for(self, seconds: float) -> None:
        """A load that nobody waits on, wanted for `seconds` (a preload, a replacement)."""
        if self._attempt is None:
            self._attempt = _Attempt()
        self._attempt.keep_until = trio.current_time() + seconds

    async def _admitted(self) -> bool:
        """Wait for room to load (max_loaded_models, memory_budget). False if the load is
        no longer wanted (its waiters gave up) or shutdown came first."""
        if self.admission is None:
            return True
        admitted = False
        with trio.CancelScope() as self._queue_scope:
            admitted = await self.admission.admit(self)
        self._queue_scope = None
        if admitted and not self._shutdown:
            return True
        if not self._shutdown:
            self._attempt = None  # nobody waits on it: there is nobody to tell
            if self.state is State.BACKOFF:
                self._set(State.STOPPED, "no request waits for a retry")
        return False

    async def _lifetime(self, attempt: _Attempt) -> None:
        """One worker, from spawn to exit."""
        self._set(State.STARTING, "requested")  # the supervisor assigns self.threads here
        self.starts += 1
        self._hung = False
        self.rss = None
        started = trio.current_time()
        self.worker_threads = self.threads or self.spec.threads
        async with trio.open_nursery() as nursery:
            conn: WorkerConnection | None = None
            try:
                with trio.CancelScope() as self._load_scope:
                    with trio.fail_after(self.settings.start_timeout or float("inf")):
                        conn = await self.launcher.start(
                            nursery, worker_spec(self.spec, self.worker_threads), self._poke
                        )
            except (LoadFailed, trio.TooSlowError, OSError) as exc:
                if isinstance(exc, trio.TooSlowError):
                    msg = f"no Ready within start_timeout={self.settings.start_timeout:g}s"
                elif isinstance(exc, OSError):
                    # The spawn itself failed: the full error (paths included) is for the
                    # log; clients see last_error in 503s.
                    log.error("%s: could not start the worker process: %s", self.name, exc)
                    msg = f"could not start the worker process ({exc.strerror or type(exc).__name__})"
                else:
                    msg = str(exc)
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
            self._measure()
            self._set(State.READY, f"loaded in {self.load_seconds:.1f}s, pid {self.pid}")
            self._attempt = None
            attempt.finish()
            self.assign_threads(self.threads)  # the cores may have been re-divided meanwhile
            nursery.start_soon(self._watch_health, conn)
            try:
                reason = await self._serve(conn)
                stable = trio.current_time() - ready_at >= self.settings.min_uptime
                if stable:
                    self.failures = 0
                if conn.closed.is_set():
                    self.crashes += 1
                    self.last_error = conn.close_reason
                    if (self._hung or self.spec.pinned) and self.state is State.READY:
                        # A hung worker is replaced, and a pinned model kept loaded, without
                        # waiting for a request: wanted for load_wait, as a preload is.
                        self._want_for(self.settings.load_wait)
                    if stable or self.state is State.DRAINING:
                        self._set(State.STOPPED, reason)  # restarted now if wanted, else on demand
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
            delay = self._backoff_delay()
            self._backoff_until = trio.current_time() + delay
            self._set(State.BACKOFF, f"{reason}; retry {self.failures}/{retries} in {delay:g}s")

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
        with trio.move_on_at(self._backoff_until):
            while not (self._shutdown or self._retire):
                await self._sleep_until_poked()
        if self._shutdown or self._retire:
            self._set(State.STOPPED, "stopping")
        elif not self.wanted():
            self._attempt = None
            self._set(State.STOPPED, "backoff over, no request waiting")
        # else: run() admits it and calls _lifetime, which goes BACKOFF -> STARTING

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
            leaving = self._leave_reason()
            if leaving is not None:
                if self._unload == "force" and self.in_flight:
                    conn.cancel_all(f"the model was {leaving} (force)")
                if self.in_flight == 0:
                    return leaving
                if self.state is State.READY:
                    self._set(State.DRAINING, f"{leaving}: waiting for {self.in_flight} request(s)")
                await self._sleep_until_poked()
            elif self.state is State.DRAINING:
                # What made it leave was withdrawn before the last request finished.
                self._set(State.READY, "a reload put it back as it runs; it stays")
            elif self.in_flight == 0 and idle_timeout > 0:
                deadline = self.last_used + idle_timeout
                if trio.current_time() >= deadline:
                    return f"idle for {idle_timeout:g}s"
                with trio.move_on_at(deadline):
                    await self._sleep_until_poked()
            else:
                await self._sleep_until_poked()

    async def _watch_health(self, conn: WorkerConnection) -> None:
        s = self.settings
        await health.watch(
            conn, self.name, s.health_interval, s.health_misses, on_ping=self._measure, on_hung=self._mark_hung
        )

    def _mark_hung(self) -> None:
        self._hung = True  # its replacement starts at once (see _lifetime)

    async def _stop(self, conn: WorkerConnection, reason: str) -> None:
        self._set(State.STOPPING, reason)
        await self.launcher.stop(conn, self.settings.stop_grace)
        self._set(State.STOPPED, "worker exited")
