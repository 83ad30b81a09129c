"""Whether one more model fits, and what to evict so that it does. Pure: no I/O, no clock.

The supervisor's admission gate (supervisor/admission.py) gathers the numbers and acts on
the decision. A model holds its share of the machine from the moment it starts loading
until its worker has exited, so a model that is still stopping counts as resident: room is
only free once the memory really is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

from supervisor.gpu_memory import POOL, fits_gpus

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str) -> int:
    """Bytes from an int or a string such as "12GiB", "500MB", "1.5 GiB" (SI and binary
    units, case-insensitive). Raises ValueError naming the accepted forms."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must be >= 0, got {value}")
        return value
    m = _SIZE.match(value)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(
            f"{value!r} is not a size; use bytes or a number with a unit such as "
            f"\"12GiB\", \"512MiB\" or \"8GB\""
        )
    return int(float(m.group(1)) * _UNITS[unit])


def gpu_budget(value: int | str | Mapping[str, int | str]) -> dict[str, int]:
    """`gpu_memory_budget` as bytes by device, {"GPU": n} for one size over all GPUs, {}
    for none. Raises ValueError naming the device whose size is not one."""
    if isinstance(value, Mapping):
        out = {}
        for dev, size in value.items():
            try:
                out[dev] = parse_size(size)
            except ValueError as exc:
                raise ValueError(f"{dev}: {exc}") from None
        return out
    n = parse_size(value)
    return {POOL: n} if n else {}


def format_size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n}B"


@dataclass(frozen=True)
class Limits:
    max_models: int = 0  # 0: no limit
    budget: int = 0  # bytes; 0: no limit
    # GPU memory, bytes a device by the config's names, or {"GPU": n} for all together
    # (supervisor/gpu_memory.py); empty: no limit.
    gpu_budget: Mapping[str, int] = field(default_factory=dict)

    @property
    def unlimited(self) -> bool:
        return self.max_models == 0 and self.budget == 0 and not self.gpu_budget


@dataclass(frozen=True)
class Resident:
    """A model that holds memory now: loading, ready, draining or stopping."""

    name: str
    cost: int  # bytes: its measured RSS once loaded, its estimate before
    last_used: float  # end of its last request; the least recent is evicted first
    evictable: bool  # ready, nothing in flight, not pinned
    leaving: bool = False  # already draining or stopping: frees its share on its own
    gpu: Mapping[str, int] = field(default_factory=dict)  # bytes on each GPU


@dataclass(frozen=True)
class Admit:
    """Start loading now."""


@dataclass(frozen=True)
class Evict:
    """Unload these (least recently used first); the newcomer fits once they are gone."""

    victims: tuple[str, ...]


@dataclass(frozen=True)
class Wait:
    """Nothing can be done now; `reason` says why, for logs and for the 503."""

    reason: str


Decision = Union[Admit, Evict, Wait]


def _fits(cost: int, gpu: Mapping[str, int], staying: Sequence[Resident], limits: Limits) -> bool:
    if limits.max_models and len(staying) + 1 > limits.max_models:
        return False
    # A model larger than the whole budget may still run alone; refusing it forever would
    # be worse than an estimate that was too high.
    if limits.budget and staying and sum(r.cost for r in staying) + cost > limits.budget:
        return False
    return not staying or fits_gpus(_gpu_used(staying), gpu, limits.gpu_budget)


def _helps(r: Resident, cost: int, gpu: Mapping[str, int], staying: Sequence[Resident], limits: Limits) -> bool:
    """Whether unloading `r` relieves a limit the newcomer is over now."""
    if limits.max_models and len(staying) + 1 > limits.max_models:
        return True
    if limits.budget and sum(x.cost for x in staying) + cost > limits.budget and r.cost > 0:
        return True
    used = _gpu_used(staying)
    if set(limits.gpu_budget) == {POOL}:
        return sum(r.gpu.values()) > 0 and not fits_gpus(used, gpu, limits.gpu_budget)
    return any(
        r.gpu.get(dev, 0) > 0 and used.get(dev, 0) + gpu.get(dev, 0) > cap for dev, cap in limits.gpu_budget.items()
    )


def _gpu_used(residents: Sequence[Resident]) -> dict[str, int]:
    used: dict[str, int] = {}
    for r in residents:
        for dev, n in r.gpu.items():
            used[dev] = used.get(dev, 0) + n
    return used


def plan(
    name: str, cost: int, residents: Sequence[Resident], limits: Limits, gpu: Mapping[str, int] | None = None
) -> Decision:
    """What to do for a model of `cost` bytes of host memory (and `gpu`, bytes on each
    GPU) that wants to load next to `residents`.

    Evicts only idle, unpinned models, least recently used first, and only as many as
    needed; evicts nothing when even evicting every candidate would not make room.
    """
    gpu = gpu or {}
    if _fits(cost, gpu, residents, limits):
        return Admit()
    staying = [r for r in residents if not r.leaving]
    if _fits(cost, gpu, staying, limits):
        leaving = ", ".join(r.name for r in residents if r.leaving)
        return Wait(f"waiting for {leaving} to stop")
    victims: list[str] = []
    for r in sorted((r for r in staying if r.evictable), key=lambda r: r.last_used):
        if not _helps(r, cost, gpu, staying, limits):
            continue  # its unload frees nothing that is short (another GPU's memory)
        victims.append(r.name)
        staying.remove(r)
        if _fits(cost, gpu, staying, limits):
            return Evict(tuple(victims))
    return Wait(_why_full(name, cost, gpu, residents, limits))


def _why_full(name: str, cost: int, gpu: Mapping[str, int], residents: Sequence[Resident], limits: Limits) -> str:
    held = ", ".join(repr(r.name) for r in residents)
    if limits.max_models and len(residents) + 1 > limits.max_models:
        limit = f"max_loaded_models = {limits.max_models}"
    elif not fits_gpus(_gpu_used(residents), gpu, limits.gpu_budget):
        on = _gpu_used(residents)
        limit = "gpu_memory_budget: " + ", ".join(
            f"{dev} {format_size(on.get(dev, 0) if dev != POOL else sum(on.values()))} in use of {format_size(cap)}"
            for dev, cap in limits.gpu_budget.items()
        ) + f", {name!r} needs about " + ", ".join(f"{format_size(n)} on {dev}" for dev, n in gpu.items())
    else:
        used = sum(r.cost for r in residents)
        limit = (
            f"memory_budget = {format_size(limits.budget)}, {format_size(used)} in use, "
            f"{name!r} needs about {format_size(cost)}"
        )
    return f"no room to load {name!r} ({limit}); every loaded model ({held}) is busy or pinned"
