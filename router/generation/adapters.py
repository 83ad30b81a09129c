"""Which LoRA adapters a request decodes under, as llama-server decides it.

A served name's adapters have ids 0, 1, ... in its list (router/server/adapter_scales.py,
which keeps the view the route's resolve found and the scales). A request applies:
- its own `lora: [{id, scale}]` where it sends a non-empty one: the adapters it names at
  their scales, every other at 0 (llama-server's construct_lora_list);
- else the name's scales now: the config's, or what POST /lora-adapters set since.
An id the name has not is a 400 naming `lora` (llama-server skips it silently, which
serves the base model to a client that believes it asked for an adapter).

The result is the worker's: (index in the base worker's loaded list, scale) pairs, no
scale 0 (worker/protocol/load_options.py, adapter_set), in Generate.adapters.
"""

from __future__ import annotations

import math
from typing import Any

from router.server.adapter_scales import Applying, Requested, check_ids
from supervisor.errors import InvalidRequest
from worker.protocol.load_options import adapter_set


MAX_ENTRIES = 256  # a model loads at most 64 adapters (supervisor/config/lora.py); a few repeats are harmless


def requested(value: Any, param: str = "lora", where: str | None = None) -> Requested | None:
    """A request's `lora` field, checked: an array of `{id, scale}` objects (scale
    defaults to 0, as llama-server's json_value does). None: absent or empty, the name's
    scales apply. `where`: the field the entries are in, for the messages (default
    `param`; POST /lora-adapters' body is the array itself)."""
    at = param if where is None else where
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidRequest(f"'{param}' must be an array of objects with 'id' and 'scale' fields", param)
    if len(value) > MAX_ENTRIES:
        raise InvalidRequest(f"'{param}' names at most {MAX_ENTRIES} adapters, got {len(value)}", param)
    out: list[tuple[int, float]] = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict) or set(entry) - {"id", "scale"}:
            raise InvalidRequest(f"{at}[{i}]: must be an object with 'id' and 'scale' fields", param)
        ident, scale = entry.get("id"), entry.get("scale", 0.0)
        if not isinstance(ident, int) or isinstance(ident, bool):
            raise InvalidRequest(f"{at}[{i}].id: must be an integer adapter id, got {ident!r}", param)
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or abs(scale) > 100:
            raise InvalidRequest(f"{at}[{i}].scale: must be a number from -100 to 100, got {scale!r}", param)
        out.append((ident, float(scale)))
    return tuple(out) or None


def for_worker(applying: Applying | None, asked: Requested | None) -> list[tuple[int, float]]:
    """The (worker index, scale) pairs a request decodes under."""
    view = applying.view if applying is not None else None
    if asked is not None:
        check_ids(view, asked)
        scales = dict(asked)  # a later entry for one id wins
        pairs = [(a.index, scales.get(i, 0.0)) for i, a in enumerate(view.adapters)] if view else []
    elif applying is not None:
        pairs = [(a.index, s) for a, s in zip(applying.view.adapters, applying.scales)]
    else:
        pairs = []
    return list(adapter_set(pairs))
