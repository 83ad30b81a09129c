"""The supervisor: one handle per configured model, name/alias resolution, and reload."""

from __future__ import annotations

import logging
import os
import time
from typing import Sequence

import trio

from supervisor.admission import Admission
from supervisor.capacity import Limits, parse_size
from supervisor.config import Config, ConfigError, ModelSpec, SupervisorConfig, load
from supervisor.cores import divide_cores
from supervisor.connection import Launcher, ProcessLauncher
from supervisor.errors import ModelNotFound
from supervisor.handle import ModelHandle
from supervisor.lifecycle import State
from supervisor.reload import ConfigDiff, diff
from supervisor.systemd import Notifier


log = logging.getLogger("corral.supervisor")


class Supervisor:
    def __init__(
        self,
        config: Config,
        worker_command: Sequence[str] | None = None,
        notifier: Notifier | None = None,
        launcher: Launcher | None = None,
        cores: int | None = None,
    ) -> None:
        self.config = config
        self._launcher = launcher or ProcessLauncher(worker_command)
        # The CPUs this process may run on (its affinity mask, which a cgroup cpuset or
        # taskset narrows), shared among workers that have no explicit `threads`.
        self.cores = cores or len(os.sched_getaffinity(0))
        self.notifier = notifier or Notifier({})
        self.admission = Admission(self._every_handle, self._limits)
        self.handles: dict[str, ModelHandle] = {
            name: self._handle(spec, config.supervisor) for name, spec in config.models.items()
        }
        self._nursery: trio.Nursery | None = None
        self._retired: list[ModelHandle] = []  # removed by a reload, maybe still draining
        self.config_error: str | None = None  # the last reload's problems, if it failed
        self.needs_restart: tuple[str, ...] = ()
        self._listening = config.server  # what the socket was opened with; reloads cannot change it

    def _handle(self, spec: ModelSpec, settings: SupervisorConfig) -> ModelHandle:
        return ModelHandle(spec, settings, self._launcher, self.admission, self._changed)

    def _every_handle(self) -> list[ModelHandle]:
        """Configured models and removed ones that are still draining: both hold memory."""
        return [*self.handles.values(), *(h for h in self._retired if not h.finished.is_set())]

    def _limits(self) -> Limits:
        s = self.config.supervisor
        return Limits(s.max_loaded_models, parse_size(s.memory_budget))

    def _changed(self) -> None:
        """A handle changed state or finished a request: re-plan the load queue and
        re-divide the cores among the workers loaded together."""
        self.admission.poke()
        together = {
            h.name: h.spec.threads
            for h in self._every_handle()
            if h.state in (State.STARTING, State.READY, State.DRAINING)
        }
        shares = divide_cores(self.cores, together)
        for h in self._every_handle():
            h.assign_threads(shares.get(h.name))

    def reload_file(self) -> ConfigDiff:
        """Re-read the config file and apply it (SIGHUP, POST /admin/reload).

        An invalid file changes nothing: the old config keeps running and ConfigError
        (naming every key path) is raised and kept in `config_error`. systemd hears
        RELOADING=1 with MONOTONIC_USEC in one datagram, then READY=1, either way.
        """
        if self.config.source is None:
            raise ConfigError(["(file): this config was not read from a file"])
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.notifier.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")
        try:
            new = load(self.config.source)
        except ConfigError as exc:
            self.config_error = "; ".join(exc.problems)
            log.error("reload rejected, still running the old config: %s", self.config_error)
            self.notifier.notify("READY=1", f"STATUS={self.status_line()}")
            raise
        d = self.reload(new)
        self.notifier.notify("READY=1", f"STATUS={self.status_line()}")
        return d

    def reload(self, new: Config) -> ConfigDiff:
        """Apply a validated config. Unchanged models keep their worker and never notice;
        removed ones drain and stop; changed ones drain and restart; added ones appear.
        A model that had failed is reset, so a fixed config recovers it. Never blocks."""
        assert self._nursery is not None, "reload() needs run() to be running"
        d = diff(self.config, new, self._listening)
        for name in d.removed:
            retired = self.handles.pop(name)
            retired.retire()
            self._retired.append(retired)
        for name in d.changed:
            self.handles[name].respec(new.models[name])
        for name in d.added:
            handle = self._handle(new.models[name], new.supervisor)
            self.handles[name] = handle
            self._nursery.start_soon(handle.run)
        self.config = new
        for handle in self.handles.values():
            handle.settings = new.supervisor
            handle.reset()
        self.config_error = None
        self.needs_restart = d.needs_restart
        self._changed()  # limits or fixed threads may differ: re-plan the queue, re-divide
        log.info("reloaded %s: %s", new.source, d.summary())
        return d

    def resolve(self, model: str) -> ModelHandle:
        """The handle for a model name or alias. Raises ModelNotFound (param "model")."""
        spec = self.config.resolve(model)
        if spec is None:
            raise ModelNotFound(f"The model `{model}` does not exist.", "model")
        return self.handles[spec.name]

    @property
    def in_flight(self) -> int:
        return sum(h.in_flight for h in self.handles.values())

    def status_line(self) -> str:
        """One line for systemd's STATUS=: how many models are loaded, loading, failed, and
        what the last reload left undone."""
        states = [h.state for h in self.handles.values()]
        loaded = sum(s is State.READY for s in states)
        loading = sum(s is State.STARTING for s in states)
        failed = sum(s is State.FAILED for s in states)
        queued = len(self.admission.queued())
        line = (
            f"{loaded} of {len(states)} models loaded, {loading} loading, {queued} queued, "
            f"{failed} failed, {self.in_flight} requests in flight"
        )
        # Kept in the line itself, not sent once: STATUS= is rewritten whenever the counts
        # change, and a rejected reload must stay visible in `systemctl status` until fixed.
        if self.config_error:
            line += f"; reload failed, running the old config: {self.config_error}"
        if self.needs_restart:
            line += f"; restart needed for {', '.join(self.needs_restart)}"
        return line

    async def wait_idle(self) -> None:
        """Return once no inference request is in flight on any model. Used only at
        shutdown, so a short poll is simpler than another event to keep in sync."""
        while self.in_flight:
            await trio.sleep(0.05)

    async def stop(self) -> None:
        """Stop every worker gracefully (Shutdown frame, then SIGTERM, then SIGKILL after
        stop_grace) and return when all handles have finished. Requests still in flight get
        up to stop_grace to finish; the CLI drains them before calling this."""
        every = [*self.handles.values(), *self._retired]
        for handle in every:
            handle.request_shutdown()
        for handle in every:
            await handle.finished.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every handle until `stop()` (graceful) or cancellation (workers killed)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for handle in self.handles.values():
                await nursery.start(handle.run)
            task_status.started()
