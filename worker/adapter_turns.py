"""Which LoRA adapter set a decode step serves: pure rules, no ctypes.

llama.cpp applies a context's adapters to every token of a batch (llama_set_adapters_lora
sets them for the context, not per sequence), so one step can only carry requests that
asked for the same set, and changing the set makes llama.cpp build its graph again. The
engine groups the running requests by set and gives each group steps in proportion to
how many requests it holds: a smooth weighted round robin (nginx's upstream rule), which
over any run of steps gives each group its share to within one step, never starves a
group, and spreads a group's turns out evenly instead of in bursts. Weighting by requests
keeps the batches large: with three requests on adapter A and one on B, A's steps carry
three tokens and come three times as often, 2.5 tokens a step where plain alternation makes
two (bench/lora.py measures what it costs against one set).

A set is the adapters a request applies with a scale other than 0, by their index in the
worker's loaded list, in index order; the empty set is the base model. llama.cpp leaves an
adapter of scale 0 out of the graph, so leaving it out here names the same computation.
"""

from __future__ import annotations

from typing import Mapping

from worker.protocol.load_options import BASE, AdapterSet, adapter_set

__all__ = ["BASE", "AdapterSet", "Turns", "adapter_set", "owner_scope", "scope_suffix"]


def scope_suffix(s: AdapterSet) -> str:
    """What a request's cache scope gains from its set, so that a prefix decoded under one
    set is never reused under another (the KV cells of a layer depend on its adapters):
    nothing for the base model, whose cells every base request shares."""
    if not s:
        return ""
    return "\x1flora:" + ",".join(f"{i}={scale!r}" for i, scale in s)


def owner_scope(scope: str) -> str:
    """The router's cache scope (whose cells they are) without the set's suffix: the
    router's scopes are hex digests, which never hold the separator."""
    return scope.split("\x1f", 1)[0]


class Turns:
    """Smooth weighted round robin over the sets that have requests to decode."""

    def __init__(self) -> None:
        self.credit: dict[AdapterSet, int] = {}

    def choose(self, counts: Mapping[AdapterSet, int], current: AdapterSet | None = None) -> AdapterSet:
        """The set the next step serves, given how many requests of each set have tokens to
        decode (each count at least 1). Ties go to `current`, the set the context holds, so
        that an even split does not pay a graph rebuild it can avoid, then to the lowest set."""
        if not counts:
            raise ValueError("no requests to choose among")
        for gone in [s for s in self.credit if s not in counts]:
            del self.credit[gone]
        if len(counts) == 1:
            (only,) = counts
            self.credit[only] = 0
            return only
        total = 0
        for s, n in counts.items():
            self.credit[s] = self.credit.get(s, 0) + n
            total += n
        best = min(counts, key=lambda s: (-self.credit[s], s != current, s))
        self.credit[best] -= total
        return best
