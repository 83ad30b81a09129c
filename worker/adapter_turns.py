"""Which LoRA adapter set a decode step serves: pure rules, no ctypes.

llama.cpp applies a context's adapters to every token of a batch (llama_set_adapters_lora
sets them for the context, not per sequence), so one step can only carry requests that
asked for the same set, and changing the set makes llama.cpp reserve its graph again. The
engine groups the running requests by set and gives each group steps in proportion to
how many requests it holds: a smooth weighted round robin (nginx's upstream rule), in
turns of `lora_turn_steps` steps (4 by default), which over any run of steps gives each
group its share to within a turn and a step and never starves a group. Weighting by requests keeps
the batches large: with three requests on adapter A and one on B, A's steps carry three
tokens and come three times as often. Turns of several steps pay the graph reservation
once a turn: on the demo model with 4 streams over base and two adapters, turns of 1, 2,
4 and 8 steps gave 0.88x, 0.94x, 0.98x and 1.00x of llama-server's tokens per second
(bench/lora.py; llama-server batches only the slots whose set is its first busy slot's); 4 keeps
each set's tokens coming every few steps.

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
    """Smooth weighted round robin over the sets that have requests to decode, in turns of
    `steps` steps: each step is charged to the set it served, as with turns of one step, but
    a set keeps the batch for `steps` steps in a row while it has requests, so that the
    graph reservation a change of set costs is paid once a turn."""

    def __init__(self, steps: int = 1) -> None:
        self.credit: dict[AdapterSet, int] = {}
        self.steps = max(1, steps)
        self.serving: AdapterSet | None = None
        self.left = 0  # steps left in the serving set's turn

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
            self.serving, self.left = only, 0
            return only
        total = sum(counts.values())
        bound = total * self.steps  # the most a turn moves a credit in this mix
        for s, n in counts.items():
            # Credit carried from a mix of more requests is bounded by this one's, so that
            # a set served in a larger mix waits at most a round of this one after it.
            self.credit[s] = max(-bound, min(bound, self.credit.get(s, 0))) + n
        if self.serving is not None and self.serving in counts and self.left > 0:
            best = self.serving
        else:
            best = min(counts, key=lambda s: (-self.credit[s], s != current, s))
            self.left = self.steps
        self.left -= 1
        self.serving = best
        self.credit[best] -= total
        return best
