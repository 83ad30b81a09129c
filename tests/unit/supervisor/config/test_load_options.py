"""llama.cpp's load options in a model's table (issue 43): each refused as llama-server's
parser or llama.cpp's context would refuse it, by `corral config check`, naming the key;
translated from llama-server's flags by `corral config import-preset`; and the memory
estimate following the KV cache's types."""

from __future__ import annotations

import struct
import tomllib
from pathlib import Path

import pytest

from supervisor.config import parse
from supervisor.config.gguf_meta import estimate_bytes, kv_cache_bytes
from supervisor.config.presets import import_preset
from tests.harness import config_problems as _problems
from tests.harness import write_gguf
from worker.protocol.load_options import (
    EXPERTS_PATTERN,
    KV_TYPES,
    BadOption,
    LoadOptions,
    kv_override,
    load_mode,
    tensor_overrides,
)

MINIMAL = '[models.a]\npath = "m.gguf"\n'


@pytest.fixture
def base(tmp_path: Path) -> Path:
    write_gguf(tmp_path / "m.gguf")
    return tmp_path


def test_every_option_reads_from_a_models_table(base: Path) -> None:
    text = MINIMAL + (
        'flash_attn = "on"\ncache_type_k = "q8_0"\ncache_type_v = "q4_0"\nmmap = false\nmlock = true\n'
        'threads_batch = 3\nn_ubatch = 128\nsplit_mode = "row"\ntensor_split = [3.0, 1.0]\nmain_gpu = 1\n'
        'devices = ["CUDA0", "CUDA1"]\nkv_offload = false\nop_offload = false\n'
        'override_tensor = ["blk\\\\.1\\\\.ffn_up=CPU"]\ncpu_moe = true\nn_cpu_moe = 2\nrope_scaling = "yarn"\n'
        "rope_freq_base = 10000.0\nrope_freq_scale = 0.5\nyarn_orig_ctx = 4096\nyarn_ext_factor = 1.0\n"
        "yarn_attn_factor = 1.0\nyarn_beta_slow = 1.0\nyarn_beta_fast = 32.0\ncheck_tensors = true\n"
        'override_kv = ["tokenizer.ggml.add_bos_token=bool:false"]\n'
    )
    spec = parse(text, base).models["a"]
    assert (spec.flash_attn, spec.cache_type_k, spec.cache_type_v, spec.mmap, spec.mlock) == ("on", "q8_0", "q4_0", False, True)
    assert (spec.threads_batch, spec.n_ubatch, spec.split_mode, spec.tensor_split, spec.main_gpu) == (3, 128, "row", [3.0, 1.0], 1)
    assert (spec.devices, spec.kv_offload, spec.op_offload) == (["CUDA0", "CUDA1"], False, False)
    assert (spec.override_tensor, spec.cpu_moe, spec.n_cpu_moe) == (["blk\\.1\\.ffn_up=CPU"], True, 2)
    assert (spec.rope_scaling, spec.rope_freq_base, spec.rope_freq_scale, spec.yarn_orig_ctx) == ("yarn", 1e4, 0.5, 4096)
    assert (spec.yarn_ext_factor, spec.yarn_attn_factor, spec.yarn_beta_slow, spec.yarn_beta_fast) == (1.0, 1.0, 1.0, 32.0)
    assert (spec.check_tensors, spec.override_kv) == (True, ["tokenizer.ggml.add_bos_token=bool:false"])


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ('cache_type_v = "q8_0"\nflash_attn = "off"\n', "models.a.cache_type_v: a quantized V cache (q8_0) needs flash attention"),
        ('cache_type_k = "q3_k"\n', "models.a.cache_type_k: expected one of"),
        ('flash_attn = "yes"\n', "models.a.flash_attn: expected one of"),
        ('split_mode = "tensor"\nflash_attn = "off"\n', 'models.a.split_mode: "tensor" needs flash attention'),
        ("direct_io = true\n", "models.a.direct_io: reads the file around the page cache"),
        ("threads_batch = 0\n", "models.a.threads_batch: must be 1..1024, got 0"),
        ("n_ubatch = 0\n", "models.a.n_ubatch: must be at least 1, got 0"),
        ("n_ubatch = 1024\n", "models.a.n_ubatch: must be at most n_batch (512), got 1024"),
        ("n_ubatch = 64\nembeddings = true\n", "models.a.n_ubatch: an embedding model takes each input in one pass"),
        (f"tensor_split = [{', '.join(['1.0'] * 16)}]\n", "models.a.tensor_split: at most 15 proportions"),
        ("tensor_split = [1.0, -1.0]\n", "models.a.tensor_split: proportions must be finite and 0 or more"),
        ("tensor_split = [1.0, nan]\n", "models.a.tensor_split: proportions must be finite and 0 or more"),
        ("main_gpu = -1\n", "models.a.main_gpu: must be 0..15, got -1"),
        ('devices = ["none", "CUDA0"]\n', 'models.a.devices: "none" (no GPU) stands alone'),
        ('devices = [" "]\n', "models.a.devices: device names must not be empty"),
        ('override_tensor = ["blk.0"]\n', 'models.a.override_tensor[0]: \'blk.0\' is not "PATTERN=BUFFER_TYPE"'),
        ('override_tensor = ["ok=CPU", "blk.(=CPU"]\n', "models.a.override_tensor[1]: 'blk.(' is not a regular expression"),
        ("n_cpu_moe = -1\n", "models.a.n_cpu_moe: must be 0 or more layers, got -1"),
        ('override_kv = ["a.b=bool:yes"]\n', "models.a.override_kv[0]: 'a.b=bool:yes': must be true or false"),
        ('override_kv = ["a.b=list:1"]\n', "models.a.override_kv[0]: 'a.b=list:1': type must be int, float, bool or str"),
        ('override_kv = ["a.b"]\n', "models.a.override_kv[0]: 'a.b' is not \"KEY=TYPE:VALUE\""),
        (f'override_kv = ["a=str:{"x" * 128}"]\n', "models.a.override_kv[0]:"),
        (f'override_kv = ["{"k" * 128}=int:1"]\n', "is longer than llama.cpp's 127 bytes"),
        ("rope_freq_base = -1.0\n", "models.a.rope_freq_base: must be 0 (the model's) or more, got -1.0"),
        ("rope_freq_scale = inf\n", "models.a.rope_freq_scale: must be 0 (the model's) or more, got inf"),
        ("yarn_orig_ctx = -5\n", "models.a.yarn_orig_ctx: must be 0 (the model's) or more, got -5"),
        ("yarn_beta_fast = -2.0\n", "models.a.yarn_beta_fast: must be -1 (the model's) or 0 or more, got -2.0"),
        ('rope_scaling = "longrope"\n', "models.a.rope_scaling: expected one of"),
    ],
)
def test_an_option_llama_cpp_would_refuse_is_a_config_problem(base: Path, lines: str, problem: str) -> None:
    problems = _problems(MINIMAL + lines, base)
    assert any(problem in p for p in problems), problems


def _gguf(path: Path, pairs: dict[str, int | str]) -> Path:
    """A header with these architecture keys (u32 or string values), no tensors."""
    body = b""
    for key, value in pairs.items():
        k = key.encode()
        body += struct.pack("<Q", len(k)) + k
        if isinstance(value, str):
            v = value.encode()
            body += struct.pack("<IQ", 8, len(v)) + v
        else:
            body += struct.pack("<II", 4, value)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs)) + body)
    return path


LLAMA_LIKE = {
    "general.architecture": "llama", "llama.block_count": 4, "llama.embedding_length": 256,
    "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
}


def test_a_quantized_cache_whose_blocks_do_not_divide_the_heads_is_refused(tmp_path: Path) -> None:
    """llama_init_from_model: "K cache type %s with block size %u does not divide
    n_embd_head_k=%u". A head of 48 values takes f16, not q8_0 (blocks of 32)."""
    # In the order converters write them: head sizes before head_count_kv, where the
    # estimate's reading stops (supervisor/config/gguf_meta.py, has_kv_shape).
    heads = {"llama.attention.key_length": 48, "llama.attention.value_length": 64}
    _gguf(tmp_path / "m.gguf", {k: v for k, v in LLAMA_LIKE.items() if "head_count_kv" not in k}
          | heads | {"llama.attention.head_count_kv": 2})
    problems = _problems(MINIMAL + 'cache_type_k = "q8_0"\n', tmp_path)
    assert any("models.a.cache_type_k: q8_0 stores values in blocks of 32" in p and "(48)" in p for p in problems)
    parse(MINIMAL + 'cache_type_k = "f16"\ncache_type_v = "q8_0"\n', tmp_path)  # 64 divides: fine


def test_an_mla_model_takes_one_type_for_k_and_v(tmp_path: Path) -> None:
    _gguf(tmp_path / "m.gguf", {**LLAMA_LIKE, "general.architecture": "deepseek2", "deepseek2.block_count": 4,
                                "deepseek2.embedding_length": 256, "deepseek2.attention.head_count": 4,
                                "deepseek2.attention.kv_lora_rank": 64})
    problems = _problems(MINIMAL + 'cache_type_k = "q8_0"\ncache_type_v = "f16"\n', tmp_path)
    assert any("must be the same" in p for p in problems), problems
    parse(MINIMAL + 'cache_type_k = "q8_0"\ncache_type_v = "q8_0"\n', tmp_path)


@pytest.mark.parametrize(
    ("mmap", "mlock", "direct_io", "mode"),
    [(True, False, False, -1), (False, False, False, 0), (False, True, False, 2), (True, True, False, 3), (False, False, True, 4)],
)
def test_mmap_mlock_and_direct_io_are_llama_cpps_load_mode(mmap: bool, mlock: bool, direct_io: bool, mode: int) -> None:
    """include/llama.h's enum llama_load_mode: AUTO -1 (mmap where the devices can),
    NONE 0, MLOCK 2, MMAP_MLOCK 3, DIRECT_IO 4."""
    assert load_mode(LoadOptions(mmap=mmap, mlock=mlock, direct_io=direct_io)) == mode


def test_the_tensor_overrides_in_llama_servers_order() -> None:
    """-ot's own patterns first, then --n-cpu-moe's per layer, then --cpu-moe's
    (common/common.h's LLM_FFN_EXPS_REGEX); a pattern may hold "=": the last one splits."""
    o = LoadOptions(override_tensor=[r"a=b=CUDA0", "token_embd=CPU"], n_cpu_moe=2, cpu_moe=True)
    assert tensor_overrides(o) == [
        ("a=b", "CUDA0"), ("token_embd", "CPU"),
        (rf"blk\.0{EXPERTS_PATTERN}", "CPU"), (rf"blk\.1{EXPERTS_PATTERN}", "CPU"), (EXPERTS_PATTERN, "CPU"),
    ]
    assert EXPERTS_PATTERN == r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def test_kv_overrides_parse_as_common_cpp_does() -> None:
    assert kv_override("tokenizer.ggml.add_bos_token=bool:false") == ("tokenizer.ggml.add_bos_token", 2, False)
    assert kv_override("llama.context_length=int:8192") == ("llama.context_length", 0, 8192)
    assert kv_override("x=float:0.5") == ("x", 1, 0.5)
    assert kv_override("general.name=str:a=b:c") == ("general.name", 3, "a=b:c")
    for bad in ("x=int:1.5", "x=int:99999999999999999999", "x=str:a\0b", "=int:1"):
        with pytest.raises(BadOption):
            kv_override(bad)


def test_the_kv_cache_estimate_follows_its_types(tmp_path: Path) -> None:
    """A cell's row per layer: 2 KV heads of 64 values, K and V. f16 2 bytes a value;
    q8_0 34 bytes a block of 32; q4_0 18 (ggml_type_size / ggml_blck_size)."""
    meta = {k: v for k, v in LLAMA_LIKE.items()}
    f16 = kv_cache_bytes(meta, 1000)  # type: ignore[arg-type]
    assert f16 == 1000 * 4 * 2 * (2 * 64 * 2)
    assert kv_cache_bytes(meta, 1000, "q8_0", "q8_0") == 1000 * 4 * 2 * (128 // 32 * 34)  # type: ignore[arg-type]
    assert kv_cache_bytes(meta, 1000, "q4_0", "q4_0") == 1000 * 4 * 2 * (128 // 32 * 18)  # type: ignore[arg-type]
    assert kv_cache_bytes(meta, 1000, "q8_0", "f16") == 1000 * 4 * (128 // 32 * 34 + 128 * 2)  # type: ignore[arg-type]
    model = _gguf(tmp_path / "m.gguf", LLAMA_LIKE)
    saved = estimate_bytes(model, 4096) - estimate_bytes(model, 4096, kv_types=("q4_0", "q4_0"))
    assert saved == 4096 * 4 * 2 * (256 - 72)
    assert set(KV_TYPES) == {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}


def test_a_q8_0_cache_makes_the_supervisors_estimate_smaller(tmp_path: Path) -> None:
    from supervisor.footprint import Footprint

    _gguf(tmp_path / "m.gguf", LLAMA_LIKE)
    f16 = Footprint().estimate(parse(MINIMAL + "n_ctx = 8192\n", tmp_path).models["a"])
    q8 = Footprint().estimate(parse(MINIMAL + 'n_ctx = 8192\ncache_type_k = "q8_0"\ncache_type_v = "q8_0"\n', tmp_path).models["a"])
    assert f16 - q8 == 8192 * 4 * 2 * (256 - 136)


def test_llama_servers_load_flags_translate(base: Path) -> None:
    """Each flag in its long, short and LLAMA_ARG_* forms (common/arg.cpp), and the
    result is a config Corral reads."""
    model = base / "m.gguf"
    ini = (
        f"[a]\nmodel = {model}\nfa = on\nctk = q8_0\nLLAMA_ARG_CACHE_TYPE_V = q8_0\nno-mmap = true\nmlock = true\n"
        "tb = 2\nub = 256\nsm = row\nts = 3/1\nmg = 1\ndev = CUDA0,CUDA1\nnkvo = 1\nno-op-offload = true\n"
        "ot = blk\\.1\\.ffn_up=CPU,token_embd=CPU\ncmoe = true\nncmoe = 3\nrope-scaling = yarn\nrope-scale = 4\n"
        "rope-freq-base = 500000\nyarn-orig-ctx = 8192\ncheck-tensors = true\n"
        "override-kv = tokenizer.ggml.add_bos_token=bool:false\nnr = 1\n"
    )
    text = import_preset(ini, "p.ini")
    data = tomllib.loads(text)["models"]["a"]
    assert data["flash_attn"] == "on" and data["cache_type_k"] == data["cache_type_v"] == "q8_0"
    assert (data["mmap"], data["mlock"], data["threads_batch"], data["n_ubatch"]) == (False, True, 2, 256)
    assert (data["split_mode"], data["tensor_split"], data["main_gpu"], data["devices"]) == ("row", [3.0, 1.0], 1, ["CUDA0", "CUDA1"])
    assert (data["kv_offload"], data["op_offload"], data["repack"]) == (False, False, False)
    assert data["override_tensor"] == ["blk\\.1\\.ffn_up=CPU", "token_embd=CPU"]
    assert (data["cpu_moe"], data["n_cpu_moe"], data["rope_scaling"], data["rope_freq_scale"]) == (True, 3, "yarn", 0.25)
    assert (data["rope_freq_base"], data["yarn_orig_ctx"], data["check_tensors"]) == (500000.0, 8192, True)
    assert data["override_kv"] == ["tokenizer.ggml.add_bos_token=bool:false"]
    parse(text, base)


@pytest.mark.parametrize(
    ("mode", "keys"),
    [
        ("none", {"mmap": False, "mlock": False}), ("mmap+mlock", {"mmap": True, "mlock": True}),
        ("mlock", {"mmap": False, "mlock": True}), ("dio", {"mmap": False, "mlock": False, "direct_io": True}),
    ],
)
def test_load_mode_becomes_mmap_and_mlock(base: Path, mode: str, keys: dict[str, bool]) -> None:
    text = import_preset(f"[a]\nmodel = {base / 'm.gguf'}\nlm = {mode}\n", "p.ini")
    data = tomllib.loads(text)["models"]["a"]
    assert {k: data[k] for k in keys} == keys
    parse(text, base)
