"""llama.cpp's load options reach llama.cpp (issue 43), shown on the demo model where a CPU
can show them: the KV cache's size at each type (as llama.cpp reports it, as the supervisor
estimates it, and in a worker's RSS), flash attention on and off answering alike, mmap off
reading the weights into the worker's own memory, a tensor override applied, metadata
overridden, and the options a CPU build cannot honour refused with a LoadError naming them."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Iterator

import llama_cpp
import pytest

from supervisor.config.gguf_meta import has_kv_shape, kv_cache_bytes, read_metadata
from tests.e2e.conftest import DEMO_MODEL
from tests.e2e.engine_driver import EngineDriver
from tests.e2e.test_kv_mixes import CANARY_TEXT, CANARY_TOKENS
from worker.load_params import model_params
from worker.model import LoadedModel, LoadError, load
from worker.protocol import WorkerSpec
from worker.protocol.load_options import EXPERTS_PATTERN, LoadOptions

N_CTX = 4096


def _load(**options: object) -> LoadedModel:
    spec = WorkerSpec(name="t", path=str(DEMO_MODEL), slots=1, n_ctx=N_CTX, **options)  # type: ignore[arg-type]
    return load(spec, lambda p: None)


@pytest.fixture(scope="module")
def kv_sizes() -> Iterator[dict[str, int]]:
    sizes = {}
    for kv in ("f16", "q8_0", "q4_0"):
        m = _load(cache_type_k=kv, cache_type_v=kv)
        assert {(c.type_k, c.type_v) for c in m.kv_caches} == {(kv, kv)}
        sizes[kv] = sum(c.k_bytes + c.v_bytes for c in m.kv_caches)
        m.close()
    yield sizes


def test_the_kv_cache_shrinks_by_its_types_block_size(kv_sizes: dict[str, int]) -> None:
    """llama.cpp's own figures (llama_kv_cache's log line): q8_0 stores 32 values in 34
    bytes, q4_0 in 18, against f16's 64."""
    f16, q8, q4 = kv_sizes["f16"], kv_sizes["q8_0"], kv_sizes["q4_0"]
    print(f"KV cache at {N_CTX} cells: f16 {f16 / 2**20:.2f} MiB, q8_0 {q8 / 2**20:.2f}, q4_0 {q4 / 2**20:.2f}")
    assert f16 > 0
    assert q8 / f16 == pytest.approx(34 / 64, rel=1e-3)
    assert q4 / f16 == pytest.approx(18 / 64, rel=1e-3)


def test_the_supervisors_estimate_is_llama_cpps_figure(kv_sizes: dict[str, int]) -> None:
    """The footprint estimate (supervisor/config/gguf_meta.py) reads the header alone; it
    must say what llama.cpp allocates, at every type (gemma-3 with swa_full: both caches
    n_ctx cells)."""
    meta = read_metadata(DEMO_MODEL, has_kv_shape)
    for kv, size in kv_sizes.items():
        assert kv_cache_bytes(meta, N_CTX, kv, kv) == pytest.approx(size, abs=2 * 10_000), kv


def _greedy(**options: object) -> tuple[list[int], list[float], list[float]]:
    """The canary's greedy tokens, each one's margin over the runner-up, and its logprob."""
    d = EngineDriver(WorkerSpec(name="t", path=str(DEMO_MODEL), slots=1, n_ctx=512, spec_type="none", **options))  # type: ignore[arg-type]
    o = d.run_alone(d.model.tokenize(CANARY_TEXT), CANARY_TOKENS)
    margins = [lp.logprob - max(t.logprob for t in lp.top if t.token != lp.token) for lp in o.logprobs[0]]
    return o.tokens[0], margins, [lp.logprob for lp in o.logprobs[0]]


def test_flash_attention_on_and_off_answer_alike() -> None:
    """Same greedy text, up to a near tie (tests/e2e/test_kv_mixes.py's canary: no margin
    under 1.0, where CPU numerics move logits by 0.3 at most)."""
    off, margins, _ = _greedy(flash_attn="off")
    on, _, _ = _greedy(flash_attn="on")
    assert min(margins) >= 1.0, margins
    assert on == off
    q8, _, _ = _greedy(flash_attn="on", cache_type_k="q8_0", cache_type_v="q8_0")
    assert q8 == off


def test_a_quantized_v_cache_without_flash_attention_is_llama_cpps_reason() -> None:
    """The config check refuses it first; a worker given it anyway says llama.cpp's own
    reason (src/llama-context.cpp), not a guess about memory."""
    with pytest.raises(LoadError, match="quantized V cache requires flash_attn"):
        _load(cache_type_v="q8_0", flash_attn="off")


def test_an_override_tensor_pattern_is_applied() -> None:
    """llama.cpp logs each tensor an override moves (llama-model-loader.cpp, debug level):
    the worker reads those lines back."""
    m = _load(override_tensor=[r"^token_embd\.weight$=CPU", r"blk\.1\.ffn_up=CPU"])
    try:
        assert dict(m.overridden) == {"token_embd.weight": "CPU", "blk.1.ffn_up.weight": "CPU"}
    finally:
        m.close()


def test_options_this_build_cannot_honour_name_themselves() -> None:
    with pytest.raises(LoadError, match=r"override_tensor: no buffer type named 'CUDA0' in this llama.cpp \(it has: CPU\)"):
        _load(override_tensor=["token_embd=CUDA0"])
    with pytest.raises(LoadError, match=r"devices: this llama.cpp has no GPU device named 'CUDA0'"):
        _load(devices=["CUDA0"])
    m = _load(devices=["none"])  # no GPU at all: loads on the CPU
    m.close()
    m = _load(mmap=False, mlock=True, check_tensors=True)  # pinned where allowed, else a warning
    m.close()


def test_the_gpu_and_moe_options_reach_llama_model_params() -> None:
    """What a CPU cannot show, read back from the llama_model_params the worker builds:
    split mode, main GPU, proportions, load mode, check_tensors, and the override array
    (patterns and buffer types, NULL-terminated) that cpu_moe and n_cpu_moe add."""
    o = LoadOptions(
        split_mode="row", main_gpu=1, tensor_split=[3.0, 1.0], mmap=False, mlock=True, check_tensors=True,
        override_tensor=["token_embd=CPU"], n_cpu_moe=1, cpu_moe=True,
        override_kv=["tokenizer.ggml.add_bos_token=bool:false", "x.y=int:7"],
    )
    p = model_params(o, n_gpu_layers=-1, repack=False)
    m = p.model
    assert (m.split_mode, m.main_gpu, m.load_mode, m.check_tensors, m.n_gpu_layers) == (2, 1, 2, True, 0x7FFFFFFF)
    assert [m.tensor_split[i] for i in range(3)] == [3.0, 1.0, 0.0]

    class Override(ctypes.Structure):
        _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

    arr = ctypes.cast(m.tensor_buft_overrides, ctypes.POINTER(Override))
    got = []
    i = 0
    while arr[i].pattern is not None:
        got.append(arr[i].pattern.decode())
        assert arr[i].buft
        i += 1
    assert got == ["token_embd", rf"blk\.0{EXPERTS_PATTERN}", EXPERTS_PATTERN]
    kv = m.kv_overrides
    assert (kv[0].key, kv[0].tag, kv[0].value.val_bool) == (b"tokenizer.ggml.add_bos_token", 2, False)
    assert (kv[1].key, kv[1].tag, kv[1].value.val_i64) == (b"x.y", 0, 7)
    assert kv[2].key == b""


def test_metadata_overrides_reach_the_model() -> None:
    """--override-kv: gemma-3 adds a BOS token; overridden, it does not."""
    m = _load(override_kv=["tokenizer.ggml.add_bos_token=bool:false"])
    try:
        assert m.add_bos is False
        assert m.tokenize("Hi")[0] != 2
    finally:
        m.close()


def test_batch_threads_and_ubatch_reach_the_context() -> None:
    m = _load(threads=1, threads_batch=2, n_ubatch=64)
    try:
        assert int(llama_cpp.llama_n_ubatch(m.ctx)) == 64
        assert (int(llama_cpp.llama_n_threads(m.ctx)), int(llama_cpp.llama_n_threads_batch(m.ctx))) == (1, 2)
        m.set_threads(1)  # the supervisor's SetThreads keeps the batch threads apart
        assert int(llama_cpp.llama_n_threads_batch(m.ctx)) == 2
    finally:
        m.close()


def test_rope_frequency_reaches_the_context() -> None:
    """A RoPE base other than the model's moves the logits (it is what context extension
    changes)."""
    _, _, base = _greedy()
    _, _, same = _greedy(rope_freq_base=0.0)  # 0: the model's own
    _, _, other = _greedy(rope_freq_base=100.0)
    assert same == base
    assert max(abs(a - b) for a, b in zip(other, base)) > 0.1, (other, base)


async def test_workers_rss_follows_the_kv_type_and_mmap() -> None:
    """The same worker at f16 and q4_0 (32k cells, where the cache dwarfs the rest), and
    with mmap off: its weights are then the worker's own memory (RssAnon), not the page
    cache's mapping (RssFile)."""
    import psutil
    import trio

    from supervisor.launcher import default_worker_command, open_worker, stop_worker

    async def rss(**options: object) -> dict[str, int]:
        spec = WorkerSpec(name="t", path=str(DEMO_MODEL), slots=1, n_ctx=32768, threads=1, **options)  # type: ignore[arg-type]
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                conn = await open_worker(nursery, spec, default_worker_command(), lambda: None)
                assert conn.process is not None
                status = psutil.Process(conn.process.pid).memory_full_info()
                out = {"rss": status.rss}
                with open(f"/proc/{conn.process.pid}/status") as f:
                    for line in f:
                        if line.startswith(("RssAnon:", "RssFile:")):
                            out[line.split(":")[0]] = int(line.split()[1]) * 1024
                await stop_worker(conn, 5.0)
                return out

    f16 = await rss()
    q4 = await rss(cache_type_k="q4_0", cache_type_v="q4_0")
    read = await rss(mmap=False)
    meta = read_metadata(DEMO_MODEL, has_kv_shape)
    saved = kv_cache_bytes(meta, 32768) - kv_cache_bytes(meta, 32768, "q4_0", "q4_0")
    print(f"RSS f16 {f16}, q4_0 {q4}, mmap off {read}; the KV types save {saved}")
    assert f16["rss"] - q4["rss"] == pytest.approx(saved, rel=0.15)
    weights = DEMO_MODEL.stat().st_size
    assert read["RssAnon"] - f16["RssAnon"] > 0.8 * weights
    assert f16["RssFile"] - read["RssFile"] > 0.8 * weights


def test_the_footprint_reads_a_real_gguf_tensor_table(tmp_path: Path) -> None:
    """The supervisor's GPU estimate (supervisor/gpu_memory.py) on the demo model's own
    tensor table, all layers offloaded: every tensor lands on the GPU, the token embeddings
    as the output's copy (gemma ties them; the input's stay home), with the KV cache."""
    from supervisor.config import parse
    from supervisor.config.gguf_meta import tensor_bytes
    from supervisor.footprint import Footprint
    from supervisor.gpu_memory import COMPUTE_BYTES

    spec = parse(f'[models.a]\npath = "{DEMO_MODEL}"\nn_gpu_layers = -1\nn_ctx = 1024\n', tmp_path).models["a"]
    t = tensor_bytes(DEMO_MODEL)
    on_gpu = Footprint().gpu(spec, {"CUDA0": "24GiB"})
    kv = 18 * 1024 * 1024  # 18 layers x 1 KV head x 256 x (K + V) x f16 x 1024 cells
    assert "output.weight" not in t
    assert on_gpu == {"CUDA0": sum(t.values()) + kv + COMPUTE_BYTES}
    assert Footprint().gpu(parse(f'[models.a]\npath = "{DEMO_MODEL}"\n', tmp_path).models["a"], {"CUDA0": "24GiB"}) == {}
    assert Footprint().gpu(spec, {"CUDA0": "24GiB"}, measured={"CUDA0": 5}) == {"CUDA0": 5}
    # What goes to the GPU leaves the host's estimate (memory_budget): every layer and the
    # KV cache; the input embeddings stay (the GPU's copy of them is extra, not moved).
    on_cpu = parse(f'[models.a]\npath = "{DEMO_MODEL}"\nn_ctx = 1024\n', tmp_path).models["a"]
    assert Footprint().estimate(on_cpu) - Footprint().estimate(spec) == sum(t.values()) - t["token_embd.weight"] + kv


def test_a_gpu_the_machine_lacks_is_a_503_naming_the_option(tmp_path: Path) -> None:
    """What the config check cannot know (this machine's GPUs) reaches a client as the
    model's load error, naming the option and what the build has; the server stays up and
    `corral config check` passed the file."""
    import httpx

    from tests.e2e.conftest import start_server, stop_server

    config = (
        '[server]\nport = {PORT}\n'
        '[models.gpu]\npath = "{MODEL}"\nchat_template = "gemma"\nn_ctx = 512\nn_gpu_layers = -1\ndevices = ["CUDA0"]\n'
        '[models.cpu]\npath = "{MODEL}"\nchat_template = "gemma"\nn_ctx = 512\n'
    )
    srv = start_server(tmp_path, config)
    try:
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                       json={"model": "gpu", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert r.status_code == 503, r.text
        assert "devices: this llama.cpp has no GPU device named 'CUDA0'" in r.text
        ok = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                        json={"model": "cpu", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert ok.status_code == 200, ok.text
    finally:
        assert stop_server(srv) == 0


def test_llama_cpps_reason_for_a_failed_load_names_no_local_path(tmp_path: Path) -> None:
    """A load error reaches clients in the 503 (worker/load_error.py): llama.cpp's own
    reason is given, with the file's path taken out (it stays in the log's detail)."""
    broken = tmp_path / "secret-folder" / "broken.gguf"
    broken.parent.mkdir()
    broken.write_bytes(DEMO_MODEL.read_bytes()[: 1 << 20])  # a header, then nothing
    with pytest.raises(LoadError) as info:
        load(WorkerSpec(name="t", path=str(broken), slots=1, n_ctx=256), lambda p: None)
    assert "llama.cpp could not load the model file (" in info.value.message
    assert "secret-folder" not in info.value.message and str(broken) in info.value.detail
