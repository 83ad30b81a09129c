"""The supervisor: one handle per configured model, name/alias resolution, and reload.

Reloads settle. SIGHUP and POST /admin/reload only ask; one reloader task reads the config
file, waits until its bytes have stayed the same for `reload_settle` seconds, and applies
what it read then. A file caught mid-write is never applied half-written, and a storm of
SIGHUPs while an editor or a deploy tool rewrites the file comes down to one or two reloads.
Writing the new file beside the old one and renaming it over it (what `mv`, most editors and
config tools do) is atomic: no read ever sees half of it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Sequence

import trio

from supervisor.admission import Admission
from supervisor.capacity import Limits, gpu_budget, parse_size
from supervisor.config import models_dir
from supervisor.config import (
    Config, ConfigError, ModelSpec, SupervisorConfig, from_bytes, read_bytes, with_server, without_file,
)
from supervisor.cache_shares import divide_bytes
from supervisor.cores import divide_cores
from supervisor.launcher import Launcher, ProcessLauncher
from supervisor.events import EventBus
from supervisor.errors import InvalidRequest, ModelNotFound
from supervisor.group import Served, regroup, served_for, workers_of
from supervisor.handle import ModelHandle
from supervisor.model_loop import run_model
from supervisor.lifecycle import State
from supervisor.reload import ConfigDiff, diff
from supervisor.replan import Replanner
from supervisor.systemd import Notifier


log = logging.getLogger("corral.supervisor")

# A file that keeps changing for this long (or 3 x reload_settle, if longer) is refused.
RELOAD_GIVE_UP = 10.0


def no_model() -> InvalidRequest:
    """A request that names no model, on a server of several models without a default_model."""
    return InvalidRequest("Missing required parameter: 'model' (this server has no default_model).", "model")


def unknown_model(model: str) -> ModelNotFound:
    return ModelNotFound(f"The model `{model}` does not exist.", "model")


class Supervisor:
    def __init__(
        self,
        config: Config,
        worker_command: Sequence[str] | None = None,
        notifier: Notifier | None = None,
        launcher: Launcher | None = None,
        cores: int | None = None,
        server_overrides: dict[str, object] | None = None,
    ) -> None:
        # [server] keys from the command line (corral serve --host/--port), which every
        # reloaded file gets too.
        self._server_overrides = server_overrides or {}
        self.config = with_server(config, self._server_overrides)
        self._launcher = launcher or ProcessLauncher(worker_command)
        # The CPUs this process may run on (its affinity mask, which a cgroup cpuset or
        # taskset narrows), shared among workers that have no explicit `threads`.
        self.cores = cores or len(os.sched_getaffinity(0))
        self.notifier = notifier or Notifier({})
        self.events = EventBus()  # lifecycle events of every model (GET /admin/events)
        self.admission = Admission(self._every_handle, self._limits)
        self.planner = Replanner(self._replan)
        self.handles: dict[str, Served] = {
            name: self._handle(spec, config.supervisor) for name, spec in config.models.items()
        }
        self._nursery: trio.Nursery | None = None
        self._retired: list[ModelHandle] = []  # removed by a reload, maybe still draining
        self.config_error: str | None = None  # the last reload's problems, if it failed
        self.needs_restart: tuple[str, ...] = ()
        self._listening = self.config.server  # what the socket was opened with; reloads cannot change it
        # Reload requests are numbered; a finished reload serves every request made before
        # it read the file for the last time.
        self._reloads_asked = 0
        self._reloads_served = 0
        self._last_reload: ConfigDiff | ConfigError | None = None
        self._reload_wanted = trio.Event()
        self._reload_finished = trio.Event()
        self._reloader_scope = trio.CancelScope()
        self._planner_scope = trio.CancelScope()

    def _handle(self, spec: ModelSpec, settings: SupervisorConfig) -> Served:
        return served_for(spec, lambda s: self._worker(s, settings))

    def _worker(self, spec: ModelSpec, settings: SupervisorConfig) -> ModelHandle:
        return ModelHandle(spec, settings, self._launcher, self.admission, self.planner, self.events)

    def _every_handle(self) -> list[ModelHandle]:
        """Configured models and removed ones that are still draining: both hold memory."""
        return [*workers_of(self.handles.values()), *(h for h in self._retired if not h.finished.is_set())]

    def _limits(self) -> Limits:
        s = self.config.supervisor
        return Limits(s.max_loaded_models, parse_size(s.memory_budget), gpu_budget(s.gpu_memory_budget))

    def _replan(self) -> None:
        """A handle changed state or finished a request: re-plan the load queue and
        re-divide the cores among the workers loaded together. Runs in the planner's task
        (supervisor/replan.py); each handle's run loop applies its share."""
        self.admission.poke()
        together = {
            h.name: h.spec.threads
            for h in self._every_handle()
            if h.state in (State.STARTING, State.READY, State.DRAINING)
        }
        shares = divide_cores(self.cores, together)
        # The host memory for saved prompts, among the generating models loaded together.
        budget = parse_size(self.config.supervisor.prompt_cache_budget)
        caching = {h.name: h.spec.prompt_cache_bytes for h in self._every_handle() if h.name in together and not h.spec.embeddings}
        cache = divide_bytes(budget, caching) if budget > 0 else {}
        for h in self._every_handle():
            h.assign_shares(shares.get(h.name), cache.get(h.name))

    # ---- reloads ------------------------------------------------------------------------------

    def request_reload(self) -> int:
        """Ask for the config file to be reloaded (SIGHUP). Never blocks. A request made
        while a reload settles is served by that reload or the next one. Returns the
        request's number, for `reload_settled`."""
        self._reloads_asked += 1
        self._reload_wanted.set()
        return self._reloads_asked

    async def reload_settled(self) -> ConfigDiff:
        """Reload the config file (POST /admin/reload) and return what changed.

        Blocks for at least `reload_settle` seconds: the answer comes from a reload that
        read the file after this call, once the file had stopped changing. Raises
        ConfigError, naming every problem, if the file is invalid (the old config runs on,
        and `config_error` says why). Cancelling the wait leaves the reload running.
        """
        self._source()  # raises at once for a config that has no file
        ticket = self.request_reload()
        while self._reloads_served < ticket:
            await self._reload_finished.wait()
        result = self._last_reload
        if isinstance(result, ConfigError):
            raise result
        assert result is not None
        return result

    async def _reloader(self) -> None:
        """The one task that reloads: it waits for a request, then for the file to settle,
        then applies it. systemd hears RELOADING=1 with MONOTONIC_USEC (one datagram) when
        a reload starts and READY=1 when it is done, applied or not."""
        with self._reloader_scope:
            while True:
                while self._reloads_served >= self._reloads_asked:
                    await self._reload_wanted.wait()
                    self._reload_wanted = trio.Event()
                usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
                self.notifier.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")
                result: ConfigDiff | ConfigError
                try:
                    data, served = await self._settled_bytes()
                    result = self.reload(self._reread(data))
                    # Whoever asked sees the failed models reset when the answer comes. A
                    # failed model's loop sleeps until poked, so this wait is a tick long.
                    for handle in list(self.handles.values()):
                        await handle.reset()
                except ConfigError as exc:
                    served = self._reloads_asked
                    self.config_error = "; ".join(exc.problems)
                    self.events.publish("config_error", problems=exc.problems)
                    log.error("reload rejected, still running the old config: %s", self.config_error)
                    result = exc
                self._finish_reloads(served, result)
                self.notifier.notify("READY=1", f"STATUS={self.status_line()}")

    def _finish_reloads(self, served: int, result: ConfigDiff | ConfigError) -> None:
        self._reloads_served = served
        self._last_reload = result
        self._reload_finished.set()
        self._reload_finished = trio.Event()

    def _source(self) -> Path | None:
        """The config file, or None for `corral serve --models-dir` without one, whose
        reloads rescan the folder alone."""
        source = self.config.source
        if source is None and "models_dir" not in self._server_overrides:
            raise ConfigError(["(file): this config was not read from a file"])
        return source

    def _reread(self, data: bytes) -> Config:
        source = self._source()
        if source is None:
            return without_file(self._server_overrides)
        return from_bytes(data, source, self._server_overrides)

    def _snapshot(self) -> tuple[bytes | ConfigError, tuple[tuple[str, int, int], ...]]:
        """The config file's bytes (none without a file) and the models folder's listing."""
        source = self._source()
        folder = self.config.server.models_dir
        return (
            b"" if source is None else _snapshot(source),
            () if folder is None else models_dir.fingerprint(Path(folder)),
        )

    async def _settled_bytes(self) -> tuple[bytes, int]:
        """The config file's bytes once they have stayed the same for reload_settle
        seconds, with how many reload requests that last read serves. Raises ConfigError if
        the file cannot be read, or if it keeps changing past RELOAD_GIVE_UP."""
        source = self._source()
        settle = self.config.supervisor.reload_settle
        patience = max(RELOAD_GIVE_UP, 3 * settle)
        give_up = trio.current_time() + patience
        before = self._snapshot()
        while True:
            await trio.sleep(settle)
            served = self._reloads_asked
            now = self._snapshot()
            if _same(before[0], now[0]) and before[1] == now[1]:
                if isinstance(now[0], ConfigError):
                    raise now[0]
                return now[0], served
            if trio.current_time() >= give_up and _same(before[0], now[0]):
                # A file is being copied into the models folder: a half-written GGUF
                # must not be served, and the copy may take minutes.
                raise ConfigError(
                    [
                        f"server.models_dir: files in {self.config.server.models_dir} still changing "
                        f"after {patience:g}s; reload again once the copy is done"
                    ],
                    str(source or ""),
                )
            if trio.current_time() >= give_up:
                raise ConfigError(
                    [
                        f"(file): still changing after {patience:g}s; "
                        "write the new config to a temporary file in the same folder and "
                        "rename it over the old one"
                    ],
                    str(source),
                )
            before = now

    def reload(self, new: Config) -> ConfigDiff:
        """Apply a validated config. Unchanged models keep their worker and never notice;
        removed ones drain and stop; changed ones drain and restart; added ones appear.
        A model that had failed is reset, so a fixed config recovers it. Never blocks."""
        assert self._nursery is not None, "reload() needs run() to be running"
        d = diff(self.config, new, self._listening)
        for name in d.removed:
            retired = self.handles.pop(name)
            retired.retire()
            self._retired.extend(workers_of([retired]))
        fresh: list[ModelHandle] = []  # handles whose run loop starts now
        for name in d.changed:
            # Instances both configs have keep their workers unless their own spec changed.
            self.handles[name], left = regroup(self.handles[name], new.models[name], lambda s: self._instance(s, new.supervisor, fresh))
            self._retired.extend(left)
        for name in d.added:
            self.handles[name] = served_for(new.models[name], lambda s: self._instance(s, new.supervisor, fresh))
        for handle in fresh:
            self._nursery.start_soon(run_model, handle)
        self.config = new
        for served in self.handles.values():
            served.adopt_settings(new.supervisor)
        self.config_error = None
        self.needs_restart = d.needs_restart
        self.planner.changed()  # limits or fixed threads may differ: re-plan the queue, re-divide
        log.info("reloaded %s: %s", new.source or f"models_dir {new.server.models_dir}", d.summary())
        self.events.publish(
            "reload", added=d.added, removed=d.removed, changed=d.changed, needs_restart=d.needs_restart,
            unloadable=d.unloadable,
        )
        return d

    def _instance(self, spec: ModelSpec, settings: SupervisorConfig, fresh: list[ModelHandle]) -> ModelHandle:
        """A reload's handle for `spec` (a model, or one instance): one removed by an earlier
        reload and still draining, taken back (two run loops under one name would share one
        entry in the load queue and the core shares); else a new one, added to `fresh`."""
        revived = self._revive(spec.name)
        if revived is not None:
            revived.respec(spec)
            return revived
        fresh.append(self._worker(spec, settings))
        return fresh[-1]

    def _revive(self, name: str) -> ModelHandle | None:
        """A retired handle for `name` whose run loop has not ended yet, taken back."""
        for h in self._retired:
            if h.name == name and h.unretire():
                self._retired.remove(h)
                return h
        return None

    def has_default_model(self) -> bool:
        """Whether a request that names no model has one to go to: `default_model`, or
        the only model of a config of one (resolve's rule)."""
        return self.config.server.default_model is not None or len(self.config.models) == 1

    def resolve(self, model: str | None) -> Served:
        """The handle for a model name or alias, or for `[server] default_model` when a
        request names none (or, with `unknown_model = "default"`, one it does not serve);
        a server of one model needs no default_model, as llama-server serving one model
        answers a request without `model`. Raises ModelNotFound, or
        InvalidRequest for a missing name without a default (both name the parameter
        "model")."""
        default = self.config.server.default_model
        if default is None and self.has_default_model():
            default = next(iter(self.config.models))
        if model is None:
            if default is None:
                raise no_model()
            model = default
        spec = self.config.resolve(model)
        if spec is None and default is not None and self.config.server.unknown_model == "default":
            spec = self.config.resolve(default)
        if spec is None:
            raise unknown_model(model)
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
        self._reloader_scope.cancel()
        if self._reloads_served < self._reloads_asked:  # nobody waits on a reload forever
            self._finish_reloads(self._reloads_asked, ConfigError(["(reload): the server is stopping"]))
        every = [*workers_of(self.handles.values()), *self._retired]
        for handle in every:
            handle.request_shutdown()
        for handle in every:
            await handle.finished.wait()
        self._planner_scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every handle until `stop()` (graceful) or cancellation (workers killed)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._plan_until_stopped)
            for handle in workers_of(self.handles.values()):
                await nursery.start(run_model, handle)
            nursery.start_soon(self._reloader)
            task_status.started()

    async def _plan_until_stopped(self) -> None:
        with self._planner_scope:
            await self.planner.run()


def _snapshot(path: Path) -> bytes | ConfigError:
    """The file's bytes now, or why it cannot be read (a rename can race a read)."""
    try:
        return read_bytes(path)
    except ConfigError as exc:
        return exc


def _same(a: bytes | ConfigError, b: bytes | ConfigError) -> bool:
    if isinstance(a, ConfigError) or isinstance(b, ConfigError):
        return isinstance(a, ConfigError) and isinstance(b, ConfigError) and a.problems == b.problems
    return a == b
