"""A GGUF written whole or not at all, for the random-weight test models in bench/ (the
projectors of bench/projector.py and bench/audio_projector.py, the Qwen2-VL pair of
bench/qwen_vl.py): written beside its path and renamed into place by `finish`, so a test or
`make` that stops half-way never leaves a file llama.cpp would half-read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SUFFIX = ".tmp"


def start(path: str | os.PathLike[str], arch: str) -> Any:
    """A gguf.GGUFWriter for `arch` that writes beside `path` until `finish`."""
    import gguf  # a test and bench dependency, not the server's

    out = Path(path)
    return gguf.GGUFWriter(str(out.with_name(out.name + SUFFIX)), arch)


def finish(writer: Any) -> None:
    """Write what was added to `writer` (from `start`) and rename it into place."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp = Path(writer.path)
    os.replace(tmp, tmp.with_name(tmp.name[: -len(SUFFIX)]))
