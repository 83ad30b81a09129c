"""What the engine's inbox carries: prepared work, and commands applied between steps."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Union

from worker.protocol import Cancel, SetCacheBudget, SetThreads, SlotFile
from worker.request import EmbedJob, Request


@dataclass(frozen=True)
class Wake:
    """Look again: an image's embeddings are ready (worker/media/encoder.py)."""


@dataclass(frozen=True)
class Persist:
    """Write the hottest saved prompts to disk (a clean stop); `done` is set after."""

    done: threading.Event = field(default_factory=threading.Event)


Inbound = Union[Request, EmbedJob, Cancel, SetThreads, SetCacheBudget, SlotFile, Persist, Wake]
