"""The LoRA adapters a served name applies (supervisor/config/lora.py makes them): kept
apart so that the config's schema can hold them without importing the checks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Adapter:
    """One adapter as a served name lists it."""

    index: int  # in the base worker's loaded list (Generate.adapters)
    path: Path
    scale: float  # what a request that names no scales gets
    task_name: str = ""  # the file's adapter.lora.task_name, shown by GET /lora-adapters
    prompt_prefix: str = ""


@dataclass(frozen=True)
class LoraView:
    """A served name's adapters: the base model's own, or an adapter model's."""

    name: str
    model: str  # the local model whose worker serves it (itself, for a base model)
    adapters: tuple[Adapter, ...]
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    @property
    def adapter_model(self) -> bool:
        """A name of its own (`base =`), not the base model's."""
        return self.name != self.model
