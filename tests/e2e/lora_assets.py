"""The random-weight LoRA adapters the tests serve (bench/lora_adapter.py), made once per
folder: deterministic, so every test process makes the same bytes."""

from __future__ import annotations

from pathlib import Path

from bench import lora_adapter
from tests.e2e.conftest import DEMO_MODEL

SEEDS = {"lora-a.gguf": 1, "lora-b.gguf": 2}


def adapters(folder: Path) -> tuple[Path, Path]:
    """Adapters A and B for the demo model, in `folder`."""
    out = []
    for name, seed in SEEDS.items():
        path = folder / name
        if not path.is_file():
            lora_adapter.write(DEMO_MODEL, path, seed=seed)
        out.append(path)
    return out[0], out[1]
