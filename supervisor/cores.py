"""How many CPU threads each loaded worker gets. Pure.

llama.cpp spins a thread per `n_threads` during every decode, so two workers that each take
every core run at well under half speed when both are busy: their threads fight for the
same cores. Workers with an explicit `threads` keep it; the cores left over are divided
among the others, evenly, and at least one each.
"""

from __future__ import annotations

from typing import Mapping


def divide_cores(cores: int, workers: Mapping[str, int | None]) -> dict[str, int]:
    """Threads for each worker that has none configured (value None), given the cores this
    process may use and the workers loaded together. Workers are served in the mapping's
    order, so the first ones get the remainder of an uneven split."""
    auto = [name for name, fixed in workers.items() if fixed is None]
    if not auto:
        return {}
    claimed = sum(fixed for fixed in workers.values() if fixed is not None)
    free = max(cores - claimed, 0)
    share, extra = divmod(free, len(auto))
    return {name: max(1, share + (1 if i < extra else 0)) for i, name in enumerate(auto)}
