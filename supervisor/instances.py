"""Several workers of one model (`instances = N`): the pure rules that name them and sum
them up. Each instance is a ModelHandle of its own, supervised like any model
(supervisor/model_loop.py); supervisor/group.py shows them to the router as one model.

An instance's spec is the model's with its name replaced by the instance's label. The
supervisor keys everything by a handle's name (the load queue, the eviction choice, the
shares of the cores and of prompt_cache_budget), so two instances under one name would
collapse into one entry there: one thread share given to both, the wrong sibling evicted.
The worker takes its prompt cache folder and its log prefix from that name too, and two
instances sharing a folder would delete each other's saved prompts (worker/prompt_store.py
keeps only its own files in it).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from supervisor.config import ModelSpec
from supervisor.lifecycle import State


def label(name: str, i: int) -> str:
    """Instance `i` of model `name`: the first keeps the model's name, so that its prompt
    cache folder and its worker survive a reload that turns `instances` on or off."""
    return name if i == 0 else f"{name}#{i}"


def instance_spec(spec: ModelSpec, i: int) -> ModelSpec:
    """The spec instance `i` of `spec`'s model runs: the model's, under its label, with no
    aliases (names resolve to the model, never to one instance)."""
    return msgspec.structs.replace(spec, name=label(spec.name, i), aliases=())


def group_state(states: Sequence[State]) -> State:
    """The state a model of several instances shows: READY while any serves; else loading
    while any loads; FAILED only when every one has failed."""
    for s in (State.READY, State.STARTING, State.DRAINING, State.STOPPING, State.BACKOFF):
        if s in states:
            return s
    if states and all(s is State.FAILED for s in states):
        return State.FAILED
    return State.STOPPED
