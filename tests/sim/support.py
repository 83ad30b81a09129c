"""Helpers for the lifecycle tests that run against SimLauncher under the virtual clock."""

from __future__ import annotations

from pathlib import Path

import trio

from supervisor.connection import RequestStream
from supervisor.handle import ModelHandle
from supervisor.lifecycle import State
from supervisor.supervisor import Supervisor
from tests.harness import make_config
from tests.behaviour import Behaviour
from tests.sim_worker import SimLauncher
from worker.protocol import SamplingParams


def sim_supervisor(
    tmp_path: Path,
    models: dict[str, dict[str, object]],
    behaviours: dict[str, Behaviour] | None = None,
    cores: int = 8,
    **settings: object,
) -> tuple[Supervisor, SimLauncher]:
    launcher = SimLauncher(behaviours)
    config = make_config(tmp_path, models, **settings)
    return Supervisor(config, launcher=launcher, cores=cores), launcher


async def until_busy(handle: ModelHandle) -> None:
    """Wait until the handle is READY with a request in flight. READY alone is not enough:
    trio may run the waiter before the request's task has taken its lease, and a model
    with nothing in flight unloads at once instead of draining."""
    await until_state(handle, State.READY)
    with trio.fail_after(86_400):
        while handle.in_flight == 0:
            await trio.sleep(0.01)


async def until_state(handle: ModelHandle, *states: State) -> float:
    """Wait (on the virtual clock) until the handle is in one of `states`; returns when.
    A state that never comes fails after a virtual day instead of hanging the suite."""
    with trio.fail_after(86_400):
        await handle.wait_for_state(*states)
    return trio.current_time()


async def finish(stream: RequestStream) -> str:
    """Read a stream to its end; the whole text."""
    text = []
    try:
        async for ev in stream:
            text.append(ev.text)
    finally:
        stream.close()
    return "".join(text)


async def complete(sup: Supervisor, model: str, max_tokens: int = 3) -> str:
    """One whole request, lease and all, as a router handler makes it."""
    async with sup.resolve(model).lease() as conn:
        return await finish(conn.generate(SamplingParams(max_tokens=max_tokens), prompt="hi"))
