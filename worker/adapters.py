"""The model's LoRA adapters: loaded with it, and applied to the context step by step.

An adapter is loaded once per model (llama_adapter_lora_init) and applied to the context
with llama.cpp's one setter, llama_set_adapters_lora(ctx, adapters, n, scales) (the
singular wrapper is deprecated), which replaces the whole set and, when the set differs
from the one held, makes llama.cpp reserve its graph again. The set applies to every token
of a decode, so each step serves the requests of one set: which one is decided by the pure
rule in worker/adapter_turns.py, and applied here only when it changes.

Every llama_decode of the engine's context goes through `apply` first: the step's batch,
an image decoded in place (worker/media/steps.py), the lone stream's run ahead (the same
request as the step before it, so the same set).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Callable, Sequence, TypeVar

import llama_cpp

from worker.adapter_turns import BASE, AdapterSet, Turns, scope_suffix
from worker.kv_cache import KvCache
from worker.llama_log import collecting
from worker.load_error import LoadError
from worker.protocol.load_options import LoraAdapter
from worker.slots import Slot

log = logging.getLogger("worker.adapters")

R = TypeVar("R")


def load_adapters(model: llama_cpp.llama_model_p, adapters: Sequence[LoraAdapter]) -> list[Any]:
    """Each adapter of the spec, loaded for `model`, in order (their indices are what
    Generate.adapters names). The config check read each file's header already
    (supervisor/config/lora.py); llama.cpp's own refusal is still a LoadError, never a crash."""
    loaded: list[Any] = []
    for i, a in enumerate(adapters):
        with collecting() as said:
            handle = llama_cpp.llama_adapter_lora_init(model, a.path.encode())
        if not handle:
            for h in loaded:
                llama_cpp.llama_adapter_lora_free(h)
            why = said.why() or "not a LoRA adapter GGUF for this model?"
            raise LoadError(
                f"llama.cpp could not load LoRA adapter {i} ({why.replace(a.path, 'the adapter file')})",
                f"llama.cpp could not load LoRA adapter {a.path}: {why}",
            )
        loaded.append(handle)
    if loaded:
        log.info("%d LoRA adapters loaded", len(loaded))
    return loaded


class Adapters:
    """The adapters of one context: which set it holds, and the turns between sets."""

    def __init__(
        self, ctx: llama_cpp.llama_context_p, handles: Sequence[Any], kv: KvCache | None = None, turn_steps: int = 1
    ) -> None:
        self.ctx = ctx
        self.handles = list(handles)
        self.current: AdapterSet = BASE
        self.turns = Turns(turn_steps)
        self.switches = 0  # how often the set changed (each a graph reservation)
        if kv is not None and self.handles:  # every decode's cells are checked against the set held (kv.sets_crossed)
            kv.under = lambda: scope_suffix(self.current)

    def apply(self, s: AdapterSet) -> None:
        """Make `s` the context's set, when it is not already."""
        if s == self.current:
            return
        n = len(s)
        ptrs = (llama_cpp.llama_adapter_lora_p_ctypes * max(n, 1))(*(self.handles[i] for i, _ in s))
        scales = (ctypes.c_float * max(n, 1))(*(scale for _, scale in s))
        rc = llama_cpp.llama_set_adapters_lora(self.ctx, ptrs if n else None, n, scales if n else None)
        if rc != 0:
            raise RuntimeError(f"llama_set_adapters_lora failed ({rc})")
        self.current = s
        self.switches += 1

    def turn(self, slots: Sequence[Slot[R]], pending: Callable[[Slot[R]], int], of: Callable[[R], AdapterSet]) -> Sequence[Slot[R]]:
        """The slots the next step may carry, of the one set whose turn it is (applied to
        the context now); idle slots pass through. With one set at work, all of them."""
        if not self.handles:
            return slots
        counts: dict[AdapterSet, int] = {}
        for s in slots:
            if s.request is not None and pending(s) > 0:
                key = of(s.request)
                counts[key] = counts.get(key, 0) + 1
        if not counts:
            return slots
        chosen = self.turns.choose(counts, self.current)
        self.apply(chosen)
        if len(counts) == 1:
            return slots
        return [s for s in slots if s.request is None or of(s.request) == chosen]
