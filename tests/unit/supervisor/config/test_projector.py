"""supervisor/config/projector.py and the `mmproj` key: a projector is checked from its GGUF
header before any worker loads it (issue 42, item 1)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from bench import audio_projector as make_audio
from bench import projector as make
from supervisor.config import ConfigError, parse
from supervisor.config import projector


def text_model(path: Path, width: int = 640) -> Path:
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_uint32("gemma3.embedding_length", width)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_projector_for_the_model_is_read_and_fits(tmp_path: Path) -> None:
    make.write(tmp_path / "mmproj.gguf")
    p = projector.read(tmp_path / "mmproj.gguf")
    assert p == projector.Projector(kind="gemma3", vision=True, audio=False, width=640)
    assert p.modalities == ("vision",)
    assert projector.problem(tmp_path / "mmproj.gguf", text_model(tmp_path / "m.gguf")) is None


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ("wide", "its embeddings are 1000 wide and the model's are 640"),
        ("model", "not a multimodal projector (its architecture is 'gemma3'"),
        ("missing", "no such file"),
        ("cut", "truncated"),
    ],
)
def test_a_projector_that_cannot_serve_the_model_is_a_config_problem(tmp_path: Path, setup: str, says: str) -> None:
    model = text_model(tmp_path / "m.gguf")
    mm = tmp_path / "mmproj.gguf"
    if setup == "wide":
        make.write(mm, width=1000)
    elif setup == "model":
        text_model(mm)
    elif setup == "cut":
        make.write(mm)
        mm.write_bytes(mm.read_bytes()[:-1000])
    config = f'[models.m]\npath = "{model}"\nmmproj = "{mm.name}"\nchat_template = "gemma"\n'
    with pytest.raises(ConfigError) as info:
        parse(config, tmp_path)
    assert any(p.startswith("models.m.mmproj: ") and says in p for p in info.value.problems), info.value.problems


def test_an_embedding_model_takes_no_projector(tmp_path: Path) -> None:
    make.write(tmp_path / "mmproj.gguf")
    config = f'[models.e]\npath = "{text_model(tmp_path / "m.gguf")}"\nmmproj = "mmproj.gguf"\nembeddings = true\n'
    with pytest.raises(ConfigError) as info:
        parse(config, tmp_path)
    assert "models.e.mmproj: an embedding model takes no images or audio" in info.value.problems


def test_the_path_is_made_absolute_for_the_worker(tmp_path: Path) -> None:
    make.write(tmp_path / "mmproj.gguf")
    cfg = parse(f'[models.m]\npath = "{text_model(tmp_path / "m.gguf")}"\nmmproj = "mmproj.gguf"\n', tmp_path)
    assert cfg.models["m"].mmproj == str(tmp_path / "mmproj.gguf")
    assert projector.modalities(cfg.models["m"].mmproj) == ("vision",)


def test_an_audio_projector_is_read_and_fits(tmp_path: Path) -> None:
    make_audio.write(tmp_path / "mmproj-audio.gguf")
    p = projector.read(tmp_path / "mmproj-audio.gguf")
    assert p == projector.Projector(kind="ultravox", vision=False, audio=True, width=640)
    assert p.modalities == ("audio",)
    model = text_model(tmp_path / "m.gguf")
    assert projector.problem(tmp_path / "mmproj-audio.gguf", model) is None
    cfg = parse(f'[models.m]\npath = "{model}"\nmmproj = "mmproj-audio.gguf"\n', tmp_path)
    assert projector.modalities(cfg.models["m"].mmproj) == ("audio",)


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ("wide", "its embeddings are 1024 wide and the model's are 640"),
        # Ultravox's own stack factor: libmtmd counts 187 tokens a window, makes 188, aborts.
        ("stack 8", "stacks 8 frames (clip.audio.projector.stack_factor), which this llama.cpp cannot encode: "
                    "it counts 187 tokens for a 30 s window and makes 188"),
    ],
)
def test_an_audio_projector_that_would_fail_is_a_config_problem_naming_mmproj(tmp_path: Path, setup: str, says: str) -> None:
    model = text_model(tmp_path / "m.gguf")
    mm = tmp_path / "mmproj-audio.gguf"
    if setup == "wide":
        make_audio.write(mm, width=1024)
    else:
        make_audio.write(mm, stack=8)
    config = f'[models.m]\npath = "{model}"\nmmproj = "{mm.name}"\nchat_template = "gemma"\n'
    with pytest.raises(ConfigError) as info:
        parse(config, tmp_path)
    assert any(p.startswith("models.m.mmproj: ") and says in p for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    ("kind", "stack", "fails"),
    [
        ("ultravox", 8, True), ("ultravox", 7, True), ("ultravox", 10, False), ("ultravox", 9, False),
        ("ultravox", 1, False), ("meralion", 8, True), ("voxtral", 8, False), ("ultravox", None, False),
    ],
)
def test_which_stack_factors_libmtmd_miscounts(kind: str, stack: int | None, fails: bool) -> None:
    """Nine does not divide 1500 and still agrees (ceil(3000/9)//2 = 167 = ceil(1500/9)).
    Voxtral's count also halves for a pooling, which this rule does not model: not judged."""
    assert (projector.stack_problem(kind, stack) is not None) == fails
