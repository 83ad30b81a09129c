"""router/generation/instances.py: which instance of a model of several serves a request,
and when a request goes to another (issue 43, item 3). The handles are never run: their
state and worker are set by hand, as the run loop would."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from router.upstream.choice import rank
from router.generation.instances import Attempt, choose, may_retry, remember, run_on_instance
from supervisor.errors import Overloaded, WorkerCrashed, WorkerUnavailable
from supervisor.group import ModelGroup
from supervisor.handle import ModelHandle
from supervisor.lifecycle import State
from tests.sim.support import sim_supervisor


def _group(tmp_path: Path, n: int = 2) -> ModelGroup:
    sup, _ = sim_supervisor(tmp_path, {"m": {"instances": n, "slots": 1}})
    group = sup.handles["m"]
    assert isinstance(group, ModelGroup)
    return group


def _ready(h: ModelHandle, active: int = 0, queued: int = 0, starts: int = 1) -> None:
    h.state = State.READY
    h.starts = starts
    h.conn = SimpleNamespace(closed=trio.Event(), ready=SimpleNamespace(slots=1), active=active, queued=queued)  # type: ignore[assignment]


def test_instances_have_their_own_names_and_start_as_one_stopped_model(tmp_path: Path) -> None:
    group = _group(tmp_path, 3)
    assert [h.name for h in group.instances] == ["m", "m#1", "m#2"]
    assert group.name == "m" and group.state is State.STOPPED


def test_a_loaded_instance_with_room_is_chosen_over_loading_a_cold_one(tmp_path: Path) -> None:
    group = _group(tmp_path)
    _ready(group.instances[1])
    assert {choose(group, f"random:{i}").name for i in range(50)} == {"m#1"}  # type: ignore[union-attr]
    # Its line full (every slot busy, requests waiting): the cold one loads for the next.
    _ready(group.instances[1], active=1, queued=1)
    group.instances[1].in_flight = 2
    assert choose(group, "random:x").name == "m"  # type: ignore[union-attr]


def test_a_failed_backing_off_or_draining_instance_takes_nothing_new(tmp_path: Path) -> None:
    group = _group(tmp_path)
    _ready(group.instances[0])
    for state in (State.FAILED, State.BACKOFF, State.DRAINING):
        group.instances[1].state = state
        assert {choose(group, f"k{i}").name for i in range(30)} == {"m"}  # type: ignore[union-attr]


def test_a_conversation_returns_to_the_instance_that_served_it_until_that_worker_restarts(tmp_path: Path) -> None:
    group = _group(tmp_path)
    first, second = group.instances
    _ready(first)
    key = next(f"start:{i}" for i in range(100) if rank(f"start:{i}", ["m", "m#1"])[0] == "m#1")
    # Only `m` was loaded when the conversation began, though it ranks `m#1` first.
    remember(group, key, choose(group, key))  # type: ignore[arg-type]
    _ready(second)
    assert choose(group, key) is first
    first.starts += 1  # a new worker: its cache is gone, the rank decides again
    assert choose(group, key) is second


async def test_a_request_the_worker_never_held_fails_over_to_each_instance_once(tmp_path: Path) -> None:
    group = _group(tmp_path, 3)
    for h in group.instances:
        _ready(h)
    tried: list[str] = []

    async def never_sent(h: ModelHandle, attempt: Attempt) -> str:
        tried.append(h.name)
        raise WorkerCrashed("the model's worker is gone")

    with pytest.raises(WorkerCrashed):
        await run_on_instance(group, "k", never_sent)
    assert sorted(tried) == ["m", "m#1", "m#2"] and group.failed_over == 3

    async def second_works(h: ModelHandle, attempt: Attempt) -> str:
        if len(tried) == 3:
            tried.append(h.name)
            raise WorkerCrashed("gone")
        return h.name

    assert await run_on_instance(group, "k", second_works) != tried[-1]


async def test_a_request_the_dead_worker_held_is_retried_once_at_most(tmp_path: Path) -> None:
    group = _group(tmp_path, 3)
    for h in group.instances:
        _ready(h)
    tried: list[str] = []

    async def killer(h: ModelHandle, attempt: Attempt) -> str:
        tried.append(h.name)
        attempt.sent = True
        raise WorkerCrashed("the model's worker is gone")

    with pytest.raises(WorkerCrashed):
        await run_on_instance(group, "k", killer)
    assert len(tried) == 2  # a poison prompt does not kill every instance in turn


def test_a_queue_timeout_on_a_serving_instance_is_the_requests_own_answer(tmp_path: Path) -> None:
    group = _group(tmp_path)
    h = group.instances[0]
    _ready(h)
    assert not may_retry(WorkerUnavailable("waited too long for a slot"), h, Attempt(), False)
    h.state = State.STOPPING  # the Generate crossed a Shutdown: another instance takes it
    assert may_retry(WorkerUnavailable("unavailable"), h, Attempt(), False)
    assert may_retry(WorkerCrashed("gone"), h, Attempt(sent=True), False)
    assert not may_retry(WorkerCrashed("gone"), h, Attempt(sent=True), True)


def test_a_request_one_full_line_refused_tries_the_others(tmp_path: Path) -> None:
    group = _group(tmp_path)
    h = group.instances[0]
    _ready(h)
    assert may_retry(Overloaded("model 'm' is at capacity", retry_after=1.0), h, Attempt(), False)
