"""The run loop of one model: the only code that changes a model's state, spec or settings.

`run_model(h)` owns the handle `h` for as long as the model is configured. It starts a worker
when a load is wanted and there is room (supervisor/admission.py), serves until the worker
dies, the model has been idle for `idle_timeout`, or an unload, a reload or a shutdown asks
it to leave, and then stops the worker. Failed starts back off and retry, then give up
(FAILED) until a reset.

Other tasks never write to the handle's lifecycle fields: they leave requests on it
(supervisor/handle.py: `respec`, `adopt_settings`, `reset`, `assign_shares`, unloads,
retirement, shutdown) and poke it. This loop applies them when it wakes, at the points
where a change of state is safe. The handle's fields that start with `_` are shared with
this module only.
"""

from __future__ import annotations

import logging
from functools import partial

import trio

from supervisor import health
from supervisor.asks import Asks, Unset
from supervisor.config import ModelSpec, gguf_meta
from supervisor.connection import WorkerConnection
from supervisor.errors import WorkerCrashed, WorkerUnavailable
from supervisor.handle import ModelHandle
from supervisor.launcher import LoadFailed, worker_spec
from supervisor.lease import LoadAttempt
from supervisor.lifecycle import State, check
from worker.protocol import SetCacheBudget, SetThreads

log = logging.getLogger("corral.supervisor")


async def run_model(
    h: ModelHandle, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Own this model until `request_shutdown()` (graceful: the worker gets a Shutdown
    frame) or cancellation (hard: the worker is killed with its nursery)."""
    task_status.started()
    if h.spec.preload:
        # Nobody waits on a preload; it keeps its place in the load queue for as long
        # as a request would.
        _want_for(h, h.settings.load_wait)
    _check_file(h)  # one bad download shows as this model's FAILED, and nothing else's
    try:
        while not h._shutdown:
            _apply_asks(h)
            if h._retire and h.state in (State.STOPPED, State.FAILED):
                return
            if h.state is State.FAILED or h._attempt is None:
                await _sleep_until_poked(h)  # a request, a reset, or shutdown
                continue
            if not await _admitted(h):
                continue
            _apply_asks(h)  # a reload while queued: start with its spec
            await _lifetime(h, h._attempt)
            if h.state is State.BACKOFF:
                await _backoff(h)
    finally:
        if h._attempt is not None:
            h._attempt.finish(WorkerUnavailable(f"model {h.name!r} is shutting down"))
            h._attempt = None
        h.finished.set()
        h._announce()


def _check_file(h: ModelHandle) -> bool:
    """A model without a worker (STOPPED, or BACKOFF before its retry) whose file no retry
    can load (gone, not a GGUF file, cut short) goes to FAILED at once, its waiters
    answered with the reason: backing off and retrying would only delay the 503 that names
    the problem. True if it did. The header was read at config time too; this catches a
    file changed since. In the event loop, not a thread: a file unchanged since the last
    read costs one stat()."""
    if h.state not in (State.STOPPED, State.BACKOFF):
        return False
    h.unloadable = False
    if (why := gguf_meta.problem(h.spec.path)) is None:
        return False
    # The path is for the log only (clients see the reason).
    log.error("%s: failed, its file cannot load (%s); the other models are served", h.name, why)
    h.unloadable = True
    h.last_error = f"the model file cannot load: {why.reason}"
    _failed_start(h, h.last_error, permanent=True)
    return True


def _want_for(h: ModelHandle, seconds: float) -> None:
    """A load that nobody waits on, wanted for `seconds` (a preload, a replacement)."""
    if h._attempt is None:
        h._attempt = LoadAttempt()
    h._attempt.keep_until = trio.current_time() + seconds


async def _admitted(h: ModelHandle) -> bool:
    """Wait for room to load (max_loaded_models, memory_budget). False if the load is
    no longer wanted (its waiters gave up) or shutdown came first."""
    if h.admission is None:
        return True
    admitted = False
    with trio.CancelScope() as h._queue_scope:
        admitted = await h.admission.admit(h)
    h._queue_scope = None
    if admitted and not h._shutdown:
        return True
    if not h._shutdown:
        h._attempt = None  # nobody waits on it: there is nobody to tell
        if h.state is State.BACKOFF:
            _set(h, State.STOPPED, "no request waits for a retry")
    return False


async def _lifetime(h: ModelHandle, attempt: LoadAttempt) -> None:
    """One worker, from spawn to exit."""
    # Checked again here: the file may have changed since the model stopped.
    if _check_file(h):
        return
    _set(h, State.STARTING, "requested")
    h.starts += 1
    h._hung = False
    h.footprint.forget()
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        conn: WorkerConnection | None = None
        try:
            with trio.CancelScope() as h._load_scope:
                # The cores are re-divided for the models loaded together, this one now
                # included: start it with its share rather than correct it once loaded.
                await h.planner.settled()
                _apply_asks(h)
                h.worker_threads = h.threads or h.spec.threads
                h.worker_cache_bytes = h.cache_bytes
                with trio.fail_after(h.settings.start_timeout or float("inf")):
                    conn = await h.launcher.start(
                        nursery, worker_spec(h.spec, h.worker_threads, h.worker_cache_bytes), h._poke,
                        on_progress=partial(_progress, h),
                    )
        except (LoadFailed, trio.TooSlowError, OSError) as exc:
            if isinstance(exc, trio.TooSlowError):
                msg = f"no Ready within start_timeout={h.settings.start_timeout:g}s"
            elif isinstance(exc, OSError):
                # The spawn itself failed: the full error (paths included) is for the
                # log; clients see last_error in 503s.
                log.error("%s: could not start the worker process: %s", h.name, exc)
                msg = f"could not start the worker process ({exc.strerror or type(exc).__name__})"
            else:
                msg = str(exc)
            _load_failed(h, attempt, msg)
            nursery.cancel_scope.cancel()
            return
        except BaseException:
            # Hard shutdown: the Cancelled comes out of open_worker's nurseries wrapped
            # in a BaseExceptionGroup, which `except trio.Cancelled` would not catch.
            _set(h, State.STOPPING, "cancelled during load")
            _set(h, State.STOPPED, "cancelled")
            raise
        finally:
            h._load_scope = None
        if conn is None:  # request_shutdown() abandoned the load
            _set(h, State.STOPPING, "shutdown during load")
            nursery.cancel_scope.cancel()  # kills the half-loaded worker
            _set(h, State.STOPPED, "shutdown")
            return
        h.conn = conn
        h.load_seconds = trio.current_time() - started
        h.last_used = ready_at = trio.current_time()
        _measure(h)
        h.last_ready = conn.ready
        _set(h, State.READY, f"loaded in {h.load_seconds:.1f}s, pid {h.pid}")
        h._attempt = None
        attempt.finish()
        _apply_asks(h)  # what was asked during the load applies to this worker
        _tell_shares(h)
        nursery.start_soon(_watch_health, h, conn)
        try:
            reason = await _serve(h, conn)
            stable = trio.current_time() - ready_at >= h.settings.min_uptime
            if stable:
                h.failures = 0
            if conn.closed.is_set():
                h.crashes += 1
                h.last_error = conn.close_reason
                if (h._hung or h.spec.pinned) and h.state is State.READY:
                    # A hung worker is replaced, and a pinned model kept loaded, without
                    # waiting for a request: wanted for load_wait, as a preload is.
                    _want_for(h, h.settings.load_wait)
                if stable or h.state is State.DRAINING:
                    _set(h, State.STOPPED, reason)  # restarted now if wanted, else on demand
                elif conn.requests_at_close:
                    # It died serving requests: one of them killed it, which a repeat of
                    # that request would do again on every worker. Counted as a failed
                    # start, it would make the model `failed` for every key; it loads again
                    # for the next request instead (READY -> STOPPED).
                    _set(h, State.STOPPED, f"{reason} serving {conn.requests_at_close} request(s)")
                else:
                    _failed_start(h, f"{reason} within min_uptime")
            else:
                await _stop(h, conn, reason)
        finally:
            if h.state in (State.READY, State.DRAINING, State.STOPPING):
                # Hard cancellation: the worker's tasks are cancelled with this nursery
                # and its process is killed; only the bookkeeping is left.
                if h.state in (State.READY, State.DRAINING):
                    _set(h, State.STOPPING, "cancelled")
                _set(h, State.STOPPED, "killed")
            h.conn = None
            # An unload asked for during the load applied to this worker; it is done. So is
            # a keep_alive: the next load idles as the config says, until a request asks.
            h._unload = None
            h.keep_alive = None
            nursery.cancel_scope.cancel()


def idle_limit(spec: ModelSpec, keep_alive: float | None) -> float | None:
    """Seconds a ready model may sit idle before it stops; None: it stays. A pinned model
    stays whatever a request asks; a request's keep_alive (Ollama's: 0 unloads as soon as
    nothing is in flight, < 0 keeps it) wins over the config's idle_timeout (0: stays)."""
    if spec.pinned:
        return None
    if keep_alive is not None:
        return None if keep_alive < 0 else keep_alive
    return spec.idle_timeout if spec.idle_timeout > 0 else None


async def _serve(h: ModelHandle, conn: WorkerConnection) -> str:
    """Wait in READY until the worker dies, the model has been idle long enough, or an
    unload has drained it."""
    while True:
        idle = idle_limit(h.spec, h.keep_alive)
        if conn.closed.is_set():
            return f"worker died: {conn.close_reason}"
        if h._shutdown:
            return "shutdown"
        leaving = h._leave_reason()
        if leaving is not None:
            if h._unload == "force" and h.in_flight:
                conn.cancel_all(f"the model was {leaving} (force)")
            if h.in_flight == 0:
                return leaving
            if h.state is State.READY:
                _set(h, State.DRAINING, f"{leaving}: waiting for {h.in_flight} request(s)")
            await _sleep_until_poked(h)
        elif h.state is State.DRAINING:
            # What made it leave was withdrawn before the last request finished.
            _set(h, State.READY, "a reload put it back as it runs; it stays")
        elif h.in_flight == 0 and idle is not None:
            deadline = h.last_used + idle
            if trio.current_time() >= deadline:
                h.sleeping = True  # until it starts again, or an unload makes it unloaded
                return f"idle for {idle:g}s" if h.keep_alive is None else f"idle for {idle:g}s (keep_alive)"
            with trio.move_on_at(deadline):
                await _sleep_until_poked(h)
        else:
            await _sleep_until_poked(h)


async def _stop(h: ModelHandle, conn: WorkerConnection, reason: str) -> None:
    _set(h, State.STOPPING, reason)
    await h.launcher.stop(conn, h.settings.stop_grace)
    _set(h, State.STOPPED, "worker exited")


async def _watch_health(h: ModelHandle, conn: WorkerConnection) -> None:
    s = h.settings
    await health.watch(
        conn, h.name, s.health_interval, s.health_misses,
        on_ping=partial(_measure, h), on_hung=partial(_mark_hung, h),
    )


def _mark_hung(h: ModelHandle) -> None:
    h._hung = True  # its replacement starts at once (see _lifetime)


def _measure(h: ModelHandle) -> None:
    h.footprint.measure(h.pid)


def _load_failed(h: ModelHandle, attempt: LoadAttempt, msg: str) -> None:
    h.last_error = msg
    _failed_start(h, f"load failed: {msg}")


def _failed_start(h: ModelHandle, reason: str, permanent: bool = False) -> None:
    """A load that failed, or a worker that died before min_uptime: back off, or give up
    after start_retries (at once if `permanent`). Waiters keep waiting through a backoff
    (their own deadline bounds them); on FAILED they all get a 503 that says not to retry."""
    h.failures += 1
    retries = h.settings.start_retries
    if permanent or h.failures > retries:
        _set(h, State.FAILED, f"{reason}; not retried" if permanent else f"{reason}; {h.failures} failed starts in a row")
        if h._attempt is not None:
            h._attempt.finish(h._failed_error())
            h._attempt = None
    else:
        delay = _backoff_delay(h)
        h.backoff_until = trio.current_time() + delay
        _set(h, State.BACKOFF, f"{reason}; retry {h.failures}/{retries} in {delay:g}s")


def _backoff_delay(h: ModelHandle) -> float:
    s = h.settings
    return float(min(s.backoff_base * 2 ** (h.failures - 1), s.backoff_max))


async def _backoff(h: ModelHandle) -> None:
    """Wait out the backoff delay (only shutdown cuts it short), then start again if a
    request is waiting, or rest in STOPPED until one arrives."""
    with trio.move_on_at(h.backoff_until):
        while not (h._shutdown or h._retire):
            await _sleep_until_poked(h)
    if h._shutdown or h._retire:
        _set(h, State.STOPPED, "stopping")
    elif not h.wanted():
        h._attempt = None
        _set(h, State.STOPPED, "backoff over, no request waiting")
    # else: run() admits it and calls _lifetime, which goes BACKOFF -> STARTING


async def _sleep_until_poked(h: ModelHandle) -> None:
    await h._wakeup.wait()
    h._wakeup = trio.Event()
    _apply_asks(h)


def _apply_asks(h: ModelHandle) -> None:
    """Apply what other tasks asked for since the last look. Only the run loop calls
    this, at the points where it may change state."""
    asks, h._asks = h._asks, Asks()
    if asks.settings is not None:
        h.settings = asks.settings
    if asks.spec is not None:
        if h.state in (State.STOPPED, State.BACKOFF, State.FAILED):
            h.spec, h._next_spec = asks.spec, None
            h.failures = 0
            asks.reset = True
        elif worker_spec(asks.spec) == worker_spec(h.spec):
            # Only the router's settings differ (generation defaults, aliases, queue
            # limits): they take effect now, and the worker keeps running.
            h.spec, h._next_spec = asks.spec, None
        else:
            h._next_spec = asks.spec
    if asks.reset and h.state is State.FAILED:
        h.failures = 0
        _set(h, State.STOPPED, "reset")
    adopted = False
    if h._next_spec is not None and h.state is State.STOPPED:
        h.spec, h._next_spec = h._next_spec, None  # the old worker is gone
        adopted = True
    if asks.reset or asks.spec is not None or adopted:
        _check_file(h)  # still or newly broken: FAILED at once, not at the next request
    if not isinstance(asks.threads, Unset):
        h.threads = asks.threads
    if not isinstance(asks.cache_bytes, Unset):
        h.cache_bytes = asks.cache_bytes
    _tell_shares(h)
    if asks.reset:
        h._announce()  # reset() waits for this (and only this: announcing wakes every waiter)


def _tell_shares(h: ModelHandle) -> None:
    """Tell a running worker its shares of the cores and of prompt_cache_budget, where
    they changed."""
    conn = h.conn
    if conn is None or conn.ready is None or h.state not in (State.READY, State.DRAINING):
        return
    try:
        if h.threads is not None and h.threads != h.worker_threads:
            conn.send(SetThreads(n_threads=h.threads))
            h.worker_threads = h.threads
        if h.cache_bytes is not None and h.cache_bytes != h.worker_cache_bytes:
            conn.send(SetCacheBudget(n_bytes=h.cache_bytes))
            h.worker_cache_bytes = h.cache_bytes
    except WorkerCrashed:
        pass


def _progress(h: ModelHandle, progress: float) -> None:
    h.events.publish("load_progress", model=h.name, progress=progress)


def _set(h: ModelHandle, new: State, reason: str) -> None:
    check(h.state, new)
    if new in (State.STARTING, State.FAILED):
        h.sleeping = False
    log.info("%s: %s -> %s (%s)", h.name, h.state.value, new.value, reason)
    h.events.publish("state", model=h.name, state=new.value, previous=h.state.value, reason=reason, pid=h.pid)
    h.state = new
    h._announce()
    h.planner.changed()
