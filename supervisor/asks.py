"""What clients ask of a model's run loop, kept until the loop next looks.

The handle (supervisor/handle.py) writes these for its clients; the run loop
(supervisor/model_loop.py) takes them and applies each where a change is safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from supervisor.config import ModelSpec, SupervisorConfig


class Unset(Enum):
    """'Not asked', where None is a value that can be asked for (threads: None)."""

    UNSET = 0


UNSET = Unset.UNSET


@dataclass
class Asks:
    """What other tasks asked of the run loop since it last looked."""

    spec: ModelSpec | None = None
    settings: SupervisorConfig | None = None
    reset: bool = False
    threads: int | None | Unset = UNSET
    cache_bytes: int | None | Unset = UNSET  # None: the model's own prompt_cache_bytes
