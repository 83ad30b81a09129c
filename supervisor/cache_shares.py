"""How much host memory each loaded worker may keep saved prompts in. Pure.

Each model has its own bound (`prompt_cache_bytes`); `supervisor.prompt_cache_budget`
bounds them all together. The budget is shared among the generating models loaded
together: evenly, except that a model whose own bound is smaller than its even share keeps
its bound and leaves the rest to the others (water-filling). The supervisor re-divides
whenever the set of loaded models changes, as it does the cores (supervisor/cores.py);
a worker told a smaller share gives up its least recently used prompts at once.
"""

from __future__ import annotations

from typing import Mapping


def divide_bytes(budget: int, wants: Mapping[str, int]) -> dict[str, int]:
    """Each model's share of `budget` (0: no global bound, every model its own), given
    each loaded model's own bound."""
    if budget <= 0:
        return dict(wants)
    shares: dict[str, int] = {}
    left, open_ = budget, sorted(wants, key=lambda n: wants[n])
    while open_:
        even = left // len(open_)
        name = open_[0]
        if wants[name] <= even:  # the smallest bound is under the even share: it is met
            shares[name] = wants[name]
            left -= wants[name]
            open_.pop(0)
            continue
        for n in open_:
            shares[n] = even
        break
    return shares
