"""The supervisor: one handle per configured model, and name/alias resolution."""

from __future__ import annotations

from typing import Sequence

import trio

from supervisor.config import Config
from supervisor.connection import default_worker_command
from supervisor.errors import ModelNotFound
from supervisor.handle import ModelHandle
from supervisor.lifecycle import State


class Supervisor:
    def __init__(self, config: Config, worker_command: Sequence[str] | None = None) -> None:
        self.config = config
        command = list(worker_command or default_worker_command())
        self.handles: dict[str, ModelHandle] = {
            name: ModelHandle(spec, config.supervisor, command)
            for name, spec in config.models.items()
        }

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
        """One line for systemd's STATUS=: how many models are loaded, loading, failed."""
        states = [h.state for h in self.handles.values()]
        loaded = sum(s is State.READY for s in states)
        loading = sum(s is State.STARTING for s in states)
        failed = sum(s is State.FAILED for s in states)
        return (
            f"{loaded} of {len(states)} models loaded, {loading} loading, {failed} failed, "
            f"{self.in_flight} requests in flight"
        )

    async def wait_idle(self) -> None:
        """Return once no inference request is in flight on any model. Used only at
        shutdown, so a short poll is simpler than another event to keep in sync."""
        while self.in_flight:
            await trio.sleep(0.05)

    async def stop(self) -> None:
        """Stop every worker gracefully (Shutdown frame, then SIGTERM, then SIGKILL after
        stop_grace) and return when all handles have finished. Requests still in flight get
        up to stop_grace to finish; the CLI drains them before calling this."""
        for handle in self.handles.values():
            handle.request_shutdown()
        for handle in self.handles.values():
            await handle.finished.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every handle until `stop()` (graceful) or cancellation (workers killed)."""
        async with trio.open_nursery() as nursery:
            for handle in self.handles.values():
                await nursery.start(handle.run)
            task_status.started()
