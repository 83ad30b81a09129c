"""What llama.cpp says while it loads a model, read back: the KV cache's size at the types it
was given, the tensors an override moved, and the error that made a load fail.

llama.cpp's C API has no call for the KV cache's allocated bytes (llama_get_memory_breakdown
is C++ and returns a std::map); its log line does say them, at info level
(llama-kv-cache.cpp):

    llama_kv_cache: size =  256.00 MiB (  8192 cells,  18 layers,  4/ 4 seqs), K (f16): 128.00 MiB, V (f16): 128.00 MiB

An iSWA model prints one such line per cache. Each buffer is logged by its type's name,
"CUDA0 model buffer size = 1234.56 MiB", which is what a GPU holds. An override prints, at
debug level (llama-model-loader.cpp):

    tensor blk.0.ffn_up.weight (1 MiB q4_K) buffer type overridden to CPU

Pure: lines in, facts out. worker/model.py feeds it while a load runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_KV = re.compile(
    r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers.*?K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB"
)
_OVERRIDE = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")
# "load_tensors:        CUDA0 model buffer size =  1234.56 MiB" (llama-model.cpp), and the
# same for "KV buffer" (llama-kv-cache.cpp) and "compute buffer" (llama-context.cpp).
_BUFFER = re.compile(r"(\S+) (?:model|KV|compute) buffer size = +([\d.]+) MiB")
_FUNCTION = re.compile(r"^\w+: ")  # "gguf_init_from_reader: ", "llama_init_from_model: "
_MIB = 1 << 20


@dataclass(frozen=True)
class KvCache:
    cells: int
    layers: int
    type_k: str
    type_v: str
    k_bytes: int
    v_bytes: int


@dataclass
class LoadLog:
    caches: list[KvCache] = field(default_factory=list)
    overridden: list[tuple[str, str]] = field(default_factory=list)  # (tensor, buffer type)
    errors: list[str] = field(default_factory=list)
    buffers: dict[str, int] = field(default_factory=dict)  # bytes by buffer type (CPU, CUDA0, ...)

    def feed(self, level: int, text: str) -> None:
        """One line of llama.cpp's log (ggml_log_level: 2 info, 3 warn, 4 error)."""
        if (m := _KV.search(text)) is not None:
            self.caches.append(KvCache(
                cells=int(m[2]), layers=int(m[3]), type_k=m[4], type_v=m[6],
                k_bytes=round(float(m[5]) * _MIB), v_bytes=round(float(m[7]) * _MIB),
            ))
        elif (m := _OVERRIDE.search(text)) is not None:
            self.overridden.append((m[1], m[2]))
        elif (m := _BUFFER.search(text)) is not None:
            self.buffers[m[1]] = self.buffers.get(m[1], 0) + round(float(m[2]) * _MIB)
        elif level == 4 and text.strip():
            self.errors.append(text.strip())

    @property
    def kv_bytes(self) -> int:
        """The KV caches' bytes, every cache of the context (0 when none was logged)."""
        return sum(c.k_bytes + c.v_bytes for c in self.caches)

    @property
    def device_bytes(self) -> dict[str, int]:
        """What the GPUs hold, by device: every buffer but host memory's (CPU, CPU_Mapped,
        CPU_REPACK, and a GPU backend's pinned host buffers, CUDA_Host)."""
        return {name: n for name, n in self.buffers.items() if not name.startswith("CPU") and not name.endswith("_Host")}

    def why(self) -> str:
        """llama.cpp's own reason for a load that failed: its first error line, the cause
        (the later ones say "failed to load model"), without the function's name; "" when
        it said none."""
        return _FUNCTION.sub("", self.errors[0], count=1) if self.errors else ""
