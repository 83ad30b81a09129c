"""A model's projector (`mmproj`): what its GGUF header says, read before any worker loads it.

llama.cpp's loader (clip.cpp, mtmd_init_from_file) refuses a projector made for another
model only once the worker loads it, as a failed load. The config check reads the header
first, as it does a model's (supervisor/config/gguf_meta.py), so that `corral config check`
and a reload say what is wrong: not a projector, no encoder, or a projection width that is
not the text model's embedding width.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from supervisor.config import gguf_meta


@dataclass(frozen=True)
class Projector:
    kind: str  # clip.projector_type (or clip.vision.projector_type), e.g. "gemma3"
    vision: bool
    audio: bool
    width: int | None  # the embeddings' width: the text model's embedding_length

    @property
    def modalities(self) -> tuple[str, ...]:
        return (("vision",) if self.vision else ()) + (("audio",) if self.audio else ())


def read(path: Path) -> Projector | str:
    """The projector at `path`, or why it is not one (for the config check)."""
    if (why := gguf_meta.problem(path)) is not None:
        return str(why)
    try:
        st = path.stat()
        return _read(path, st.st_size, st.st_mtime_ns)
    except (OSError, gguf_meta.NotGGUF) as exc:
        return f"{path}: cannot be read ({exc})"


@functools.lru_cache(maxsize=64)
def _read(path: Path, _size: int, _mtime_ns: int) -> Projector | str:
    meta = gguf_meta.read_metadata(path)
    if meta.get("general.architecture") != "clip":
        return f"{path}: not a multimodal projector (its architecture is {meta.get('general.architecture')!r}, not 'clip')"
    vision = meta.get("clip.has_vision_encoder") is True
    audio = meta.get("clip.has_audio_encoder") is True
    if not vision and not audio:
        return f"{path}: a projector with neither a vision nor an audio encoder"
    kind = meta.get("clip.projector_type", meta.get("clip.vision.projector_type", meta.get("clip.audio.projector_type")))
    width = meta.get("clip.vision.projection_dim") if vision else meta.get("clip.audio.projection_dim")
    if "clip.has_text_encoder" in meta:
        # Written by llama.cpp's legacy converters (tools/mtmd/legacy-models: llava-1.5 and
        # 1.6, MiniCPM-V, GLM-Edge), whose projection_dim is the CLIP tower's own (768), or
        # 0, not the text model's width: the header cannot tell the width, the load will.
        width = None
    return Projector(str(kind), vision, audio, width if isinstance(width, int) and width > 0 else None)


def text_width(model: Path) -> int | None:
    """The text model's embedding width (`{arch}.embedding_length`), or None if unread."""
    try:
        meta = gguf_meta.read_metadata(model, enough=lambda m: "general.architecture" in m and any(
            k.endswith(".embedding_length") for k in m))
    except (OSError, gguf_meta.NotGGUF):
        return None
    arch = meta.get("general.architecture")
    width = meta.get(f"{arch}.embedding_length")
    return width if isinstance(width, int) else None


def problem(mmproj: Path, model: Path) -> str | None:
    """Why `mmproj` cannot serve `model`, or None."""
    p = read(mmproj)
    if isinstance(p, str):
        return p
    width = text_width(model)
    if p.width is not None and width is not None and p.width != width:
        return (
            f"{mmproj}: its embeddings are {p.width} wide and the model's are {width}: "
            "a projector made for another model"
        )
    return None


def modalities(mmproj: str | None) -> tuple[str, ...]:
    """What a model with this projector takes besides text (empty: none, or unreadable)."""
    if mmproj is None:
        return ()
    p = read(Path(mmproj))
    return () if isinstance(p, str) else p.modalities
