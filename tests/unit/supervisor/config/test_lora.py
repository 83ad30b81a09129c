"""supervisor/config/lora.py: an adapter is checked from its GGUF header against the base's
tensors before any worker loads it, as src/llama-adapter.cpp would refuse it; adapter models
(`base =`) share their base's worker and get ids of their own (issue 45, items 1 and 3)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from bench import gguf_out
from bench import lora_adapter
from supervisor.config import ConfigError, lora, parse


def base_model(path: Path, arch: str = "gemma3") -> Path:
    """A tiny text model: two blocks of the weights an adapter targets, ne [in, out]."""
    w = gguf.GGUFWriter(str(path), arch)
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((16, 8), np.float32))  # ne [8, 16]
        w.add_tensor(f"blk.{i}.attn_v.weight", np.zeros((4, 8), np.float32))
        w.add_tensor(f"blk.{i}.ffn_down.weight", np.zeros((8, 12), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def adapter_with(
    path: Path, tensors: dict[str, np.ndarray], arch: str = "gemma3", kind: str = "adapter", alora: list[int] | None = None
) -> Path:
    w = gguf_out.start(path, arch)
    w.add_string("general.type", kind)
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 4.0)
    if alora is not None:
        w.add_array("adapter.alora.invocation_tokens", alora)
    for name, t in tensors.items():
        w.add_tensor(name, t)
    gguf_out.finish(w)
    return path


def test_an_adapter_made_for_the_model_fits(tmp_path: Path) -> None:
    base = base_model(tmp_path / "m.gguf")
    assert lora_adapter.write(base, tmp_path / "a.gguf", rank=2) == 6
    assert lora.problem(tmp_path / "a.gguf", base) is None
    lora_adapter.write(base, tmp_path / "h.gguf", rank=2, f16=True)
    assert lora.problem(tmp_path / "h.gguf", base) is None


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("arch", "an adapter for architecture 'llama', and the model is 'gemma3'"),
        ("type", "not a LoRA adapter"),
        ("missing_b", "has only its lora_a"),
        ("unknown", "adapts 'blk.0.attn_k.weight', which the model has not"),
        ("shape", "do not fit the model's [8, 16]"),
        ("transposed", "do not fit the model's [8, 16]"),
        ("suffix", "neither a lora_a nor a lora_b"),
        ("empty", "holds no lora_a/lora_b tensors"),
        ("missing", "no such file"),
        ("alora", "an activated LoRA (aLoRA), which Corral does not serve"),
    ],
)
def test_an_adapter_llama_cpp_would_refuse_is_named_with_why(tmp_path: Path, case: str, expected: str) -> None:
    base = base_model(tmp_path / "m.gguf")
    a, b = np.zeros((2, 8), np.float32), np.zeros((16, 2), np.float32)  # ne [8, 2], [2, 16]
    q = "blk.0.attn_q.weight"
    path = tmp_path / "a.gguf"
    if case == "arch":
        lora_adapter.write(base, path, rank=2, arch="llama")
    elif case == "type":
        adapter_with(path, {f"{q}.lora_a": a, f"{q}.lora_b": b}, kind="model")
    elif case == "missing_b":
        adapter_with(path, {f"{q}.lora_a": a})
    elif case == "unknown":
        adapter_with(path, {"blk.0.attn_k.weight.lora_a": a, "blk.0.attn_k.weight.lora_b": b})
    elif case == "shape":  # ranks that disagree
        adapter_with(path, {f"{q}.lora_a": a, f"{q}.lora_b": np.zeros((16, 3), np.float32)})
    elif case == "transposed":  # the old finetune example's layout
        adapter_with(path, {f"{q}.lora_a": a.T.copy(), f"{q}.lora_b": b.T.copy()})
    elif case == "suffix":
        adapter_with(path, {f"{q}.lora_c": a})
    elif case == "empty":
        adapter_with(path, {})
    elif case == "alora":
        adapter_with(path, {f"{q}.lora_a": a, f"{q}.lora_b": b}, alora=[5, 6])
    why = lora.problem(path, base)
    assert why is not None and expected in why, why


def test_adapter_models_share_the_base_worker_and_number_their_own_ids(tmp_path: Path) -> None:
    base_model(tmp_path / "m.gguf")
    for name, seed in (("a.gguf", 1), ("b.gguf", 2)):
        lora_adapter.write(tmp_path / "m.gguf", tmp_path / name, seed=seed, rank=2)
    cfg = parse(
        '[models.m]\npath = "m.gguf"\nlora = [{ path = "a.gguf", scale = 0.5 }]\n'
        '[models.bot]\nbase = "m"\naliases = ["b"]\nlora = [{ path = "b.gguf" }, { path = "a.gguf", scale = 2.0 }]\n',
        tmp_path,
    )
    # The worker loads each file once: the base's own first.
    assert [Path(x.path).name for x in cfg.models["m"].lora] == ["a.gguf", "b.gguf"]
    assert "bot" not in cfg.models  # no worker of its own
    bot = cfg.lora["bot"]
    assert bot.adapter_model and bot.model == "m"
    assert [(x.index, x.path.name, x.scale) for x in bot.adapters] == [(1, "b.gguf", 1.0), (0, "a.gguf", 2.0)]
    assert [(x.index, x.scale) for x in cfg.lora["m"].adapters] == [(0, 0.5)]
    # Names resolve to the base's spec; the view follows the name asked for.
    assert cfg.resolve("b") is cfg.models["m"] and cfg.resolve("bot") is cfg.models["m"]
    assert cfg.lora_view("b") is bot and cfg.lora_view("m") is cfg.lora["m"]
    assert cfg.adapter_model("m") is None and cfg.adapter_model("b") is bot


def test_adapter_model_tables_are_checked(tmp_path: Path) -> None:
    base_model(tmp_path / "m.gguf")
    base_model(tmp_path / "l.gguf", arch="llama")
    lora_adapter.write(tmp_path / "m.gguf", tmp_path / "a.gguf", rank=2)
    text = (
        '[models.m]\npath = "m.gguf"\nlora_turn_steps = 0\n'
        '[models.l]\npath = "l.gguf"\n'
        '[models.e]\npath = "m.gguf"\nembeddings = true\nlora = [{ path = "a.gguf" }]\n'
        '[models.r]\nupstream = "http://127.0.0.1:9"\nlora = [{ path = "a.gguf" }]\n'
        '[models.x]\nbase = "nope"\nlora = [{ path = "a.gguf" }]\n'
        '[models.y]\nbase = "m"\nslots = 2\nlora = [{ path = "a.gguf", scale = 1e9 }]\n'
        '[models.z]\nbase = "m"\n'
        '[models.w]\nbase = "l"\nlora = [{ path = "a.gguf" }]\n'
        '[models.v]\nbase = "y"\nlora = [{ path = "a.gguf" }]\n'
    )
    with pytest.raises(ConfigError) as info:
        parse(text, tmp_path)
    problems = "\n".join(info.value.problems)
    for expected in (
        "models.e.lora: an embedding model takes no adapters here",
        "models.r.lora: adapters apply to a model served here (with `path`)",
        "models.x.base: 'nope' is not a model in [models]",
        "models.y.slots: an adapter model is served by its base's worker; set it on models.m",
        "models.y.lora[0].scale: must be -100..100, got 1000000000.0",
        "models.z.lora: an adapter model names at least one adapter",
        "models.w.lora[0].path:",
        "an adapter for architecture 'gemma3', and the model is 'llama'",
        "models.v.base: 'y' must be a model served here",
        "models.m.lora_turn_steps: must be 1..256, got 0",
    ):
        assert expected in problems, (expected, problems)
