"""What a model costs in memory: its worker's measured RSS once it runs, before that an
estimate from its GGUF file."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import psutil

from supervisor.config import ModelSpec
from supervisor.config.gguf_meta import (
    NotGGUF,
    draft_bytes,
    estimate_bytes,
    has_kv_shape,
    kv_layer_bytes,
    projector_bytes,
    read_metadata,
    tensor_bytes,
)
from supervisor.gpu_memory import Placement, place
from worker.protocol.load_options import BadOption


def process_rss(pid: int | None) -> int | None:
    """Resident memory of a process, or None when there is none (or it just exited)."""
    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


class Footprint:
    def __init__(self) -> None:
        self.rss: int | None = None  # the running worker's, measured at load and every ping
        self._estimate: tuple[ModelSpec, int] | None = None
        self._gpu: tuple[ModelSpec, tuple[str, ...], Placement] | None = None

    def gpu(
        self, spec: ModelSpec, budget: int | str | Mapping[str, int | str] = 0, measured: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """Bytes the model holds or will hold on each GPU: what llama.cpp said it allocated
        (`measured`, from a running worker's Ready) or else the estimate
        (supervisor/gpu_memory.py), over the GPUs the gpu_memory_budget table names; {}
        when nothing is offloaded."""
        if measured:
            return dict(measured)
        return self._placement(spec, list(budget) if isinstance(budget, dict) else []).gpu

    def _placement(self, spec: ModelSpec, gpus: list[str]) -> Placement:
        """Where the model's layers go, read once per spec from its GGUF's tensor table."""
        if spec.n_gpu_layers == 0 or spec.devices == ["none"]:
            return Placement({}, 0)
        if self._gpu is None or self._gpu[0] is not spec or self._gpu[1] != tuple(gpus):
            try:
                meta = read_metadata(spec.path, has_kv_shape)
                n_layer = meta.get(f"{meta.get('general.architecture')}.block_count")
                kv = kv_layer_bytes(meta, spec.n_ctx, spec.cache_type_k, spec.cache_type_v)
                placed = (
                    place(tensor_bytes(spec.path), n_layer, kv, spec.n_gpu_layers, spec, gpus)
                    if isinstance(n_layer, int) else Placement({}, 0)
                )
            except (NotGGUF, OSError, BadOption):
                placed = Placement({}, 0)
            self._gpu = (spec, tuple(gpus), placed)
        return self._gpu[2]

    def measure(self, pid: int | None) -> None:
        rss = process_rss(pid)
        if rss is not None:
            self.rss = rss

    def forget(self) -> None:
        """A new worker starts: the last one's measurement says nothing about it."""
        self.rss = None

    def cost(self, spec: ModelSpec, running: bool) -> int:
        """Bytes the model holds or will hold: the RSS of a running worker once measured,
        otherwise the estimate."""
        if running and self.rss is not None:
            return max(self.rss, 1)
        return self.estimate(spec)

    def estimate(self, spec: ModelSpec) -> int:
        """Host memory: the GGUF file's size plus its KV cache for n_ctx cells at its types
        (and a draft model's, and a projector's: worker/media/beside.py), less what goes to
        a GPU (its layers' weights and KV cache: `gpu`), read once per spec.
        Reading stops at the last key it needs, a few hundred bytes in, so it is done
        inline."""
        if self._estimate is None or self._estimate[0] is not spec:
            try:
                kv_types = (spec.cache_type_k, spec.cache_type_v)
                n = estimate_bytes(spec.path, spec.n_ctx, generates=not spec.embeddings, kv_types=kv_types)
                # Offloaded weights and KV leave host memory: llama.cpp unmaps the file's
                # ranges only a GPU reads.
                n -= self._placement(spec, []).moved
                if spec.draft_model is not None and spec.spec_type != "none":
                    n += draft_bytes(Path(spec.draft_model), spec.n_ctx)
                if spec.mmproj is not None:
                    beside = 0 if spec.n_gpu_layers != 0 else min(spec.n_ctx_slot or spec.n_ctx, spec.n_ctx)
                    n += projector_bytes(Path(spec.mmproj), Path(spec.path), beside, kv_types)
            except OSError:
                n = 0
            self._estimate = (spec, n)
        return self._estimate[1]
