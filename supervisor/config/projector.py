"""A model's projector (`mmproj`): what its GGUF header says, read before any worker loads it.

llama.cpp's loader (clip.cpp, mtmd_init_from_file) refuses a projector made for another
model only once the worker loads it, as a failed load. The config check reads the header
first, as it does a model's (supervisor/config/gguf_meta.py), so that `corral config check`
and a reload say what is wrong: not a projector, no encoder, a projection width that is not
the text model's embedding width, or an audio projector this llama.cpp would abort on.

An audio projector that stacks the encoder's frames (Ultravox's, MERaLiON's) has libmtmd
count ceil(3000 / stack) // 2 tokens for a 30 s window (clip.cpp, clip_n_output_tokens),
while its graph pads the encoder's 1500 frames with ggml's GGML_PAD, which rounds up only
for a power of two (models/whisper-enc.cpp, build_stack), so that the tokens it makes
depend on the encoder's width too. Where the two differ the first encode aborts the whole
worker process, every request on it lost: a stack of 8 on a 768-wide encoder (187 counted,
188 made), or of 9 on a 1280-wide one; Ultravox's own, 8 on 1280, agrees, and any stack that
divides 1500 does. Such a projector loads without complaint (its warmup reserves the graph
and computes nothing), so only the header tells, and the config check refuses it.
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
    # The audio encoder's, where it differs from the vision one's (a projector with both).
    audio_width: int | None = None
    # Why libmtmd would abort on its audio (a stack factor it miscounts), or None.
    unusable: str | None = None

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
    v_width, a_width = meta.get("clip.vision.projection_dim"), meta.get("clip.audio.projection_dim")
    if "clip.has_text_encoder" in meta:
        # Written by llama.cpp's legacy converters (tools/mtmd/legacy-models: llava-1.5 and
        # 1.6, MiniCPM-V, GLM-Edge), whose projection_dim is the CLIP tower's own (768), or
        # 0, not the text model's width: the header cannot tell the width, the load will.
        v_width = None
    width = v_width if vision else a_width
    audio_kind = meta.get("clip.audio.projector_type", kind)
    return Projector(
        str(kind), vision, audio, width if isinstance(width, int) and width > 0 else None,
        a_width if vision and audio and isinstance(a_width, int) else None,
        stack_problem(str(audio_kind), meta.get("clip.audio.projector.stack_factor"), meta.get("clip.audio.embedding_length"))
        if audio else None,
    )


# The audio projectors whose graph stacks the encoder's frames with no pooling after
# (tools/mtmd/clip-model.h, audio_has_stack_frames; models/whisper-enc.cpp).
STACKED = ("ultravox", "meralion")
WINDOW_FRAMES = 3000  # a 30 s window's mel frames; the encoder's convolution halves them


def stack_problem(kind: str, stack: object, width: object) -> str | None:
    """Why an audio projector of type `kind` stacking `stack` frames of an encoder `width`
    wide would abort the worker at its first encode, or None (also where the header lacks
    either: clip.cpp then refuses the load itself). Pure."""
    if kind not in STACKED or not isinstance(stack, int) or not isinstance(width, int) or stack < 1 or width < 1:
        return None
    counted = -(-WINDOW_FRAMES // stack) // 2  # what libmtmd expects (clip_n_output_tokens)
    frames, stride = WINDOW_FRAMES // 2 * width, stack * width  # the encoder's output, one stacked row
    made = ((frames + stride - 1) & ~(stride - 1)) // stride  # build_stack: GGML_PAD, a bit mask
    if counted == made:
        return None
    return (
        f"its audio encoder stacks {stack} frames of {width} (clip.audio.projector.stack_factor, "
        f"clip.audio.embedding_length), which this llama.cpp cannot encode: it counts {counted} tokens "
        f"for a 30 s window and makes {made}, and aborts the worker at the first audio it is sent "
        f"(a stack factor that divides {WINDOW_FRAMES // 2} works)"
    )


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
    if p.unusable is not None:
        return f"{mmproj}: {p.unusable}"
    width = text_width(model)
    for mine in (p.width, p.audio_width):
        if mine is not None and width is not None and mine != width:
            return (
                f"{mmproj}: its embeddings are {mine} wide and the model's are {width}: "
                "a projector made for another model"
            )
    return None


def modalities(mmproj: str | None) -> tuple[str, ...]:
    """What a model with this projector takes besides text (empty: none, or unreadable)."""
    if mmproj is None:
        return ()
    p = read(Path(mmproj))
    return () if isinstance(p, str) else p.modalities
