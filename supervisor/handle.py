"""A model's handle: what the rest of Corral may read of a model and ask of it.

The model's run loop (supervisor/model_loop.py) is the single writer of its state, spec and
settings. Everyone else is a client. `respec()`, `adopt_settings()`, `reset()`,
`assign_shares()`, `request_unload()`, `retire()` and `request_shutdown()` leave a request
and wake the loop, which applies it where a change is safe. `acquire()` never branches on a
state it read earlier: it either takes the ready worker in the same scheduler tick that it
checked it (so an idle stop cannot slip in between), or waits on the shared load attempt and
looks again.
"""

from __future__ import annotations

import math
import time
from contextlib import AbstractAsyncContextManager

import trio

from supervisor.admission import Admission
from supervisor.asks import UNSET, Asks
from supervisor.capacity import Resident
from supervisor.config import ModelSpec, SupervisorConfig, projector
from supervisor.connection import WorkerConnection
from supervisor.footprint import Footprint, process_rss
from supervisor.launcher import Launcher
from supervisor.lease import Lease, LoadAttempt, leased
from supervisor.errors import WorkerUnavailable
from supervisor.events import EventBus
from supervisor.lifecycle import State
from supervisor.replan import Immediate, Planner
from supervisor.request_rate import RequestRate
from supervisor.slot_order import Place
from supervisor.slot_queue import SlotQueue, Ticket
from supervisor.stats import LoadedFacts, ModelStats
from worker.protocol import Ready

# The states in which a model holds memory and CPU: from spawn until its process is gone.
HOLDING = (State.STARTING, State.READY, State.DRAINING, State.STOPPING)
# How long a client that gave up waiting for room is told to wait before trying again.
QUEUE_RETRY_AFTER = 5.0


class ModelHandle:
    def __init__(
        self,
        spec: ModelSpec,
        settings: SupervisorConfig,
        launcher: Launcher,
        admission: Admission | None = None,
        planner: Planner | None = None,
        events: EventBus | None = None,
    ) -> None:
        self.launcher = launcher
        self.events = events or EventBus()  # lifecycle events, for GET /admin/events
        self.admission = admission
        # Told of every state change and every finished request: the supervisor re-plans
        # the load queue and re-divides the cores.
        self.planner: Planner = planner or Immediate()
        self.finished = trio.Event()  # set when the run loop has returned

        # Written by the run loop only (supervisor/model_loop.py).
        self.spec = spec
        self.settings = settings
        self.state = State.STOPPED
        self.conn: WorkerConnection | None = None
        self.starts = 0
        self.crashes = 0
        self.failures = 0  # failed starts in a row; reset by a worker that stays up min_uptime
        self.last_error: str | None = None
        # Its file cannot load whatever is retried (gone, not a GGUF file, cut short): FAILED
        # before any worker starts, until a reset or a reload finds the file mended.
        self.unloadable = False
        self.load_seconds: float | None = None
        # Stopped for idleness, and not loaded or unloaded since: llama-server's "sleeping"
        # (its --sleep-idle-seconds frees the model the same way), which a request wakes
        # even where the server loads nothing by itself ([server] models_autoload = false).
        self.sleeping = False
        self.last_ready: Ready | None = None  # the last worker's Ready: GET /props while asleep
        self.footprint = Footprint()
        self.threads: int | None = None  # the share of the cores given by the supervisor
        self.worker_threads: int | None = None  # what the running worker was told to use
        self.cache_bytes: int | None = None  # its share of prompt_cache_budget, as threads
        self.worker_cache_bytes: int | None = None
        self._next_spec: ModelSpec | None = None  # from a reload, adopted once stopped
        self._hung = False  # its worker was killed for missing pings: replace it at once
        self.backoff_until = 0.0
        self._load_scope: trio.CancelScope | None = None
        self._queue_scope: trio.CancelScope | None = None

        # Written by clients: requests in flight, and what they ask of the run loop.
        self.in_flight = 0
        self.slot_queue = SlotQueue(spec.name)  # generations in line for the worker's slots
        self.last_used: float = 0.0  # trio clock: the last request's end, or the last load
        self.last_used_wall: float | None = None  # time.time() of the last request's end
        self.requests = RequestRate()  # leases taken, for requests_per_minute
        self._attempt: LoadAttempt | None = None  # the load that waiters share
        self._asks = Asks()
        self._unload: str | None = None  # "drain" or "force" while an unload runs
        self._unload_reason = ""
        # Ollama's keep_alive, as the last request that sent one asked: seconds the model
        # stays loaded once idle (< 0: for ever); None: the config's idle_timeout.
        self.keep_alive: float | None = None
        self._retire = False  # removed from the config: stop for good
        self._shutdown = False

        # Wake-ups: the run loop sleeps on _wakeup; waiters on _state_changed.
        self._wakeup = trio.Event()
        self._state_changed = trio.Event()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def rss(self) -> int | None:
        """The running worker's resident memory, as last measured."""
        return self.footprint.rss

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
            name=self.name, aliases=tuple(self.spec.aliases), modalities=projector.modalities(self.spec.mmproj),
            lora=tuple(a.path.rpartition("/")[2] for a in self.spec.lora),
            state=self.state, pid=pid, rss_bytes=process_rss(pid),
            slots=ready.slots if ready is not None else self.spec.slots,
            slots_busy=conn.active if conn is not None else 0, queued=conn.queued if conn is not None else 0,
            waiting=self.slot_queue.waiting, waiting_by_priority=self.slot_queue.waiting_by_class(),
            in_flight=self.in_flight,
            last_used=self.last_used_wall,
            load_seconds=self.load_seconds,
            restarts=max(self.starts - 1, 0),
            last_error=self.last_error,
            pinned=self.spec.pinned,
            cost_bytes=self.cost(),
            threads=(pong.threads or None) if pong is not None else self.worker_threads,
            loaded=LoadedFacts.of(ready) if ready is not None else None,
            prompt_tokens_decoded=pong.prompt_tokens_decoded if pong is not None else None,
            kv_cells_used=pong.kv_cells_used if pong is not None else None,
            kv_repairs=pong.kv_repairs if pong is not None else None,
            kv_prefixes_refused=pong.kv_prefixes_refused if pong is not None else None,
            prompt_cache=dict(pong.prompt_cache) if pong is not None else {},
            requests_per_minute=self.requests.count(time.monotonic()),
            tokens_generated=conn.tokens_generated if conn is not None else None,
        )

    # ---- clients --------------------------------------------------------------------------

    def lease(self) -> AbstractAsyncContextManager[WorkerConnection]:
        """`acquire()` for the duration of a block."""
        return leased(self.acquire)

    async def acquire(self) -> Lease:
        """The ready worker, counted in flight until `release()`.

        Blocks while the model loads (every concurrent caller shares one load). Raises
        WorkerUnavailable if the load fails. Cancelling the wait leaves the load running for
        others. While a lease is held the worker is never stopped for idleness. A streaming
        response holds its lease past the handler that took it, hence no context manager.
        """
        conn = await self._acquire()
        self.requests.record(time.monotonic())
        return Lease(conn, self._release)

    async def take_slots(self, conn: WorkerConnection, slots: int, place: Place = Place()) -> Ticket:
        """`slots` of the leased worker `conn`'s slots, in the turn `place` gives it
        (supervisor/slot_order.py), within max_queue and queue_timeout. Blocks until
        granted; cancelling leaves the line. Raises Overloaded or WorkerUnavailable."""
        self.slot_queue.resize(conn.ready.slots if conn.ready is not None else self.spec.slots)
        return await self.slot_queue.take(slots, self.spec.max_queue, self.spec.queue_timeout, place)

    async def ensure_ready(self) -> None:
        """Load the model if it is not loaded, and return once it is ready. Raises like
        `acquire()`; counts as a use for the idle timer, but not as a request (an admin's
        load is not traffic)."""
        Lease(await self._acquire(), self._release).release()

    def _release(self) -> None:
        self.in_flight -= 1
        self.last_used = trio.current_time()
        self.last_used_wall = time.time()
        self._poke()
        self.planner.changed()  # an idle model may now be evicted

    def set_keep_alive(self, seconds: float | None) -> None:
        """How long the model stays loaded once idle, from now on (model_loop.idle_limit)."""
        self.keep_alive = seconds
        self._poke()

    def request_unload(self, force: bool = False, reason: str = "unloaded by an admin") -> None:
        """Stop the worker once nothing is in flight (state DRAINING meanwhile); with
        `force`, cancel what is in flight first. Never blocks. A request that arrives
        meanwhile waits for the stop and then loads the model again."""
        if self.state in (State.STARTING, State.READY, State.DRAINING):
            self._unload = "force" if force or self._unload == "force" else "drain"
            self._unload_reason = reason
            self.sleeping = False
            self.events.publish("unloading", model=self.name, reason=reason, force=force)
            self._poke()

    def respec(self, spec: ModelSpec) -> None:
        """Adopt a model's settings from a reload. Never blocks; the run loop applies it.

        Without a worker, at once. A worker that runs other settings drains, stops, and
        the next start uses these. A worker that already runs these settings keeps running,
        and a restart still pending from an earlier reload is cancelled: the comparison is
        with what the worker runs, not with the last file, so a reload that restores a
        model's settings undoes the restart an intermediate file asked for.
        """
        self._asks.spec = spec
        self._poke()

    def adopt_settings(self, settings: SupervisorConfig) -> None:
        """The [supervisor] table of a reloaded config; a failed model gets another chance
        with it. Never blocks; the run loop applies it."""
        self._asks.settings = settings
        self._asks.reset = True
        self._poke()

    async def reset(self) -> bool:
        """FAILED -> STOPPED, so the next request tries again; returns once applied. False
        if the model had not failed."""
        if self.state is not State.FAILED or self.finished.is_set():
            return False
        self._asks.reset = True
        self._poke()
        while self._asks.reset and not self.finished.is_set():
            await self._state_changed.wait()
        return True

    def assign_shares(self, threads: int | None, cache_bytes: int | None) -> None:
        """Shares of the cores (None: own `threads`) and of prompt_cache_budget (None: none).
        Never blocks: the run loop tells a running worker at once, a loading one when ready."""
        asks, now = self._asks, (threads, cache_bytes)
        if (asks.threads, asks.cache_bytes) != (UNSET, UNSET) or now != (self.threads, self.cache_bytes):
            asks.threads, asks.cache_bytes = now
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
                self._attempt = LoadAttempt()
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
                    self.planner.changed()
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
            left = max(self.backoff_until - trio.current_time(), 1.0)
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
        """Bytes this model holds or will hold (see supervisor/footprint.py)."""
        running = self.state in (State.READY, State.DRAINING, State.STOPPING)
        return self.footprint.cost(self.spec, running)

    def estimated_cost(self) -> int:
        return self.footprint.estimate(self.spec)

    def estimated_gpu(self) -> dict[str, int]:  # bytes on each GPU (supervisor/gpu_memory.py)
        ready = self.conn.ready if self.conn is not None and self.holds_memory else None
        return self.footprint.gpu(self.spec, self.settings.gpu_memory_budget, ready.device_bytes if ready else None)

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
            gpu=self.estimated_gpu(),
        )

    def _poke(self) -> None:
        self._wakeup.set()

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

    def _failed_error(self) -> WorkerUnavailable:
        if self.unloadable:
            return WorkerUnavailable(
                f"model {self.name!r} is unavailable: {self.last_error}; mend the file, then "
                "reset the model or reload the config",
                retry=False,
            )
        return WorkerUnavailable(
            f"model {self.name!r} failed to start {self.failures} times in a row "
            f"(last error: {self.last_error}); it stays unavailable until a reset or a "
            f"config reload",
            retry=False,
        )
