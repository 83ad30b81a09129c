"""llama.cpp's load log read back (worker/load_log.py), on lines made with its own format
strings: llama-kv-cache.cpp's "%s: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs),
K (%s): %7.2f MiB, V (%s): %7.2f MiB", llama-model.cpp's "%s: %12s model buffer size =
%8.2f MiB", llama-context.cpp's "%s: %10s compute buffer size = %8.2f MiB", and
llama-model-loader.cpp's "tensor %s (%zu MiB %s) buffer type overridden to %s"."""

from __future__ import annotations

from worker.load_log import KvCache, LoadLog

MIB = 1 << 20


def c_format(fmt: str, *args: object) -> str:
    return fmt % args


def test_a_gpu_load_is_read_back_device_by_device() -> None:
    log = LoadLog()
    lines = [
        (2, c_format("%s: %12s model buffer size = %8.2f MiB", "load_tensors", "CPU_Mapped", 166.92)),
        (2, c_format("%s: %12s model buffer size = %8.2f MiB", "load_tensors", "CUDA0", 4096.5)),
        (2, c_format("%s: %12s model buffer size = %8.2f MiB", "load_tensors", "CUDA1", 1024.0)),
        (2, c_format("%s: %10s KV buffer size = %8.2f MiB", "llama_kv_cache", "CUDA0", 256.0)),
        (2, c_format("%s: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs), K (%s): %7.2f MiB, V (%s): %7.2f MiB",
                     "llama_kv_cache", 256.0, 8192, 32, 4, 1, "q8_0", 128.0, "q8_0", 128.0)),
        (2, c_format("%s: %10s compute buffer size = %8.2f MiB", "sched_reserve", "CUDA0", 300.25)),
        (2, c_format("%s: %10s compute buffer size = %8.2f MiB", "sched_reserve", "CUDA_Host", 24.0)),
        (1, c_format("tensor %s (%zu MiB %s) buffer type overridden to %s".replace("%zu", "%d"),
                     "blk.3.ffn_up_exps.weight", 96, "q4_K", "CPU")),
        (4, "llama_init_from_model: quantized V cache requires flash_attn to be enabled"),
    ]
    for level, text in lines:
        log.feed(level, text)
    assert log.device_bytes == {"CUDA0": round((4096.5 + 256.0 + 300.25) * MIB), "CUDA1": 1024 * MIB}
    assert log.caches == [KvCache(cells=8192, layers=32, type_k="q8_0", type_v="q8_0", k_bytes=128 * MIB, v_bytes=128 * MIB)]
    assert log.kv_bytes == 256 * MIB
    assert log.overridden == [("blk.3.ffn_up_exps.weight", "CPU")]
    assert log.why() == "quantized V cache requires flash_attn to be enabled"


def test_a_cpu_load_holds_nothing_on_a_gpu() -> None:
    log = LoadLog()
    log.feed(2, "load_tensors:   CPU_REPACK model buffer size =    12.00 MiB")
    log.feed(2, "llama_kv_cache:        CPU KV buffer size =    72.00 MiB")
    assert log.device_bytes == {} and log.buffers == {"CPU_REPACK": 12 * MIB, "CPU": 72 * MIB}
    assert log.why() == ""
