"""Which GPU holds what of a model, before it loads (supervisor/gpu_memory.py), and the
gpu_memory_budget deciding what is evicted on a GPU host (issue 43, item 2). Pure rules,
tested without a GPU: the placement follows llama.cpp's load_tensors (src/llama-model.cpp:
the last n_gpu_layers of n_layer + 1 layers, spread by cumulative tensor_split)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.capacity import Admit, Evict, Limits, Resident, Wait, gpu_budget, plan
from supervisor.config import ConfigError, parse
from supervisor.gpu_memory import COMPUTE_BYTES, POOL, gpu_bytes, layer_devices
from tests.harness import write_gguf
from worker.protocol.load_options import LoadOptions

MIB = 1 << 20
N_LAYER = 4


def tensors(experts: bool = False) -> dict[str, int]:
    """A 4-layer model: 10 MiB of attention a layer (and 30 MiB of experts with
    `experts`), 50 MiB of token embeddings, 40 MiB of output."""
    out = {"token_embd.weight": 50 * MIB, "output.weight": 40 * MIB, "output_norm.weight": 1 * MIB}
    for il in range(N_LAYER):
        out[f"blk.{il}.attn_q.weight"] = 10 * MIB
        if experts:
            out[f"blk.{il}.ffn_up_exps.weight"] = 30 * MIB
    return out


KV = [2 * MIB] * N_LAYER


def test_the_last_n_gpu_layers_go_to_the_gpu() -> None:
    """n_gpu_layers = 2 of 5 (4 blocks and the output layer): block 3 and the output."""
    assert layer_devices(N_LAYER, 2, LoadOptions(), ["CUDA0"]) == [None, None, None, "CUDA0", "CUDA0"]
    assert layer_devices(N_LAYER, -1, LoadOptions(), ["CUDA0"]) == ["CUDA0"] * 5
    assert layer_devices(N_LAYER, 0, LoadOptions(), ["CUDA0"]) == [None] * 5
    got = gpu_bytes(tensors(), N_LAYER, KV, 2, LoadOptions(), ["CUDA0"])
    assert got == {"CUDA0": 10 * MIB + 2 * MIB + 41 * MIB + COMPUTE_BYTES}


def test_tensor_split_spreads_layers_as_llama_cpp_does() -> None:
    """Split points are the cumulative proportions; layer il goes to the first device
    whose point is above il / layers (std::upper_bound)."""
    o = LoadOptions(tensor_split=[3.0, 1.0])
    assert layer_devices(N_LAYER, -1, o, ["CUDA0", "CUDA1"]) == ["CUDA0", "CUDA0", "CUDA0", "CUDA0", "CUDA1"]
    even = layer_devices(N_LAYER, -1, LoadOptions(), ["CUDA0", "CUDA1"])
    assert even == ["CUDA0", "CUDA0", "CUDA0", "CUDA1", "CUDA1"]
    alone = layer_devices(N_LAYER, -1, LoadOptions(split_mode="none", main_gpu=1), ["CUDA0", "CUDA1"])
    assert alone == ["CUDA1"] * 5


def test_experts_on_the_cpu_leave_the_gpu_and_kv_offload_off_keeps_the_cache_home() -> None:
    full = gpu_bytes(tensors(experts=True), N_LAYER, KV, -1, LoadOptions(), ["CUDA0"])
    moe = gpu_bytes(tensors(experts=True), N_LAYER, KV, -1, LoadOptions(cpu_moe=True), ["CUDA0"])
    first = gpu_bytes(tensors(experts=True), N_LAYER, KV, -1, LoadOptions(n_cpu_moe=1), ["CUDA0"])
    assert full["CUDA0"] - moe["CUDA0"] == 4 * 30 * MIB
    assert full["CUDA0"] - first["CUDA0"] == 30 * MIB
    home = gpu_bytes(tensors(), N_LAYER, KV, -1, LoadOptions(kv_offload=False), ["CUDA0"])
    assert full["CUDA0"] - 4 * 30 * MIB - home["CUDA0"] == 4 * 2 * MIB
    moved = gpu_bytes(tensors(), N_LAYER, KV, 0, LoadOptions(override_tensor=["token_embd=CUDA1"]), ["CUDA0"])
    assert moved == {"CUDA1": 50 * MIB + COMPUTE_BYTES}


def test_devices_name_the_gpus_and_none_means_none() -> None:
    assert set(gpu_bytes(tensors(), N_LAYER, KV, -1, LoadOptions(devices=["CUDA1"]), ["CUDA0", "CUDA1"])) == {"CUDA1"}
    assert gpu_bytes(tensors(), N_LAYER, KV, -1, LoadOptions(devices=["none"]), ["CUDA0"]) == {}
    assert set(gpu_bytes(tensors(), N_LAYER, KV, -1, LoadOptions(), [])) == {POOL}


def _resident(name: str, gpu: dict[str, int], evictable: bool = True, last_used: float = 0.0) -> Resident:
    return Resident(name, cost=100, last_used=last_used, evictable=evictable, gpu=gpu)


def test_a_gpu_budget_evicts_the_least_recent_model_on_that_gpu() -> None:
    limits = Limits(gpu_budget={"CUDA0": 10_000, "CUDA1": 10_000})
    residents = [
        _resident("old", {"CUDA0": 6_000}, last_used=1.0),
        _resident("new", {"CUDA0": 3_000}, last_used=5.0),
        _resident("other", {"CUDA1": 9_000}, last_used=0.0),
    ]
    assert plan("x", 100, residents, limits, {"CUDA1": 500}) == Admit()
    # Only "old" must go for 5,000 more on CUDA0; "other", older still, is on CUDA1.
    assert plan("x", 100, residents, limits, {"CUDA0": 5_000}) == Evict(("old",))
    busy = [_resident("old", {"CUDA0": 6_000}, evictable=False), _resident("new", {"CUDA0": 3_000}, evictable=False)]
    decision = plan("x", 100, busy, limits, {"CUDA0": 5_000})
    assert isinstance(decision, Wait) and "gpu_memory_budget: CUDA0 8.8KiB in use" in decision.reason
    # Host memory alone would admit it: without a GPU budget, the GPU bytes do not count.
    assert plan("x", 100, busy, Limits(budget=10_000), {"CUDA0": 5_000}) == Admit()


def test_one_size_is_one_pool_for_every_gpu() -> None:
    limits = Limits(gpu_budget={POOL: 10_000})
    residents = [_resident("a", {"CUDA0": 4_000}, last_used=1.0), _resident("b", {"CUDA1": 4_000}, last_used=2.0)]
    assert plan("x", 100, residents, limits, {"CUDA1": 2_000}) == Admit()
    assert plan("x", 100, residents, limits, {"CUDA1": 3_000}) == Evict(("a",))
    # A model larger than the whole budget still runs alone, as for memory_budget.
    assert plan("x", 100, [], limits, {"CUDA0": 50_000}) == Admit()


def test_gpu_memory_budget_reads_as_a_size_or_a_table(tmp_path: Path) -> None:
    assert gpu_budget("22GiB") == {POOL: 22 << 30}
    assert gpu_budget(0) == {}
    assert gpu_budget({"CUDA0": "22GiB", "CUDA1": 1000}) == {"CUDA0": 22 << 30, "CUDA1": 1000}
    write_gguf(tmp_path / "m.gguf")
    cfg = parse('[supervisor]\ngpu_memory_budget = { CUDA0 = "22GiB" }\n[models.a]\npath = "m.gguf"\n', tmp_path)
    assert cfg.supervisor.gpu_memory_budget == {"CUDA0": "22GiB"}
    with pytest.raises(ConfigError) as info:
        parse('[supervisor]\ngpu_memory_budget = { CUDA0 = "lots" }\n[models.a]\npath = "m.gguf"\n', tmp_path)
    assert any(p.startswith("supervisor.gpu_memory_budget.CUDA0: 'lots' is not a size") for p in info.value.problems)
