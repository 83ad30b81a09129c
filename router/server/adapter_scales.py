"""The LoRA adapters of the served name a request resolved, and the scales each name's
adapters have now: request state, like the key (router/server/auth.py), kept by the route's
resolve for the generation (router/generation/adapters.py) and /lora-adapters.

A served name's adapters (supervisor/config/lora.py, LoraView) have ids 0, 1, ... in its
list, as llama-server's --lora flags number them. Their scales start as the config says;
POST /lora-adapters sets them (`Scales`), llama-server's way: every adapter not named at 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from quart import g, has_app_context

from supervisor.config.lora_views import LoraView
from supervisor.errors import InvalidRequest

Requested = tuple[tuple[int, float], ...]  # a request's own `lora`, as (id, scale)


@dataclass(frozen=True)
class Applying:
    """A served name's adapters and their scales when the request was resolved."""

    view: LoraView
    scales: tuple[float, ...]  # one per view.adapters


def check_ids(view: LoraView | None, asked: Requested, where: str = "lora", param: str = "lora") -> None:
    """A 400 naming `param` for an id the served name has no adapter for; `where`: the
    field the entries are in (POST /lora-adapters' body is the array itself)."""
    n = 0 if view is None else len(view.adapters)
    for i, (ident, _) in enumerate(asked):
        if not 0 <= ident < n:
            has = f"its ids are 0..{n - 1}" if n else "it has none"
            raise InvalidRequest(f"{where}[{i}].id: this model has no LoRA adapter with id {ident}: {has}", param)


def remember(view: LoraView | None, scales: Sequence[float]) -> None:
    """Keep a resolved name's adapters for the request being served."""
    if has_app_context():
        g.corral_lora = None if view is None else Applying(view, tuple(scales))


def current() -> Applying | None:
    """The adapters of the name the request being served resolved (None: none, or no
    request: `corral chat` runs generations in its own process)."""
    if not has_app_context():
        return None
    applying: Applying | None = g.get("corral_lora")
    return applying


class Scales:
    """The scales POST /lora-adapters set, by served name (the config's until then). Kept
    by the router: they outlive a worker's restart, as llama-server's outlive nothing but
    its own. Each is set against the name's adapters as the config had them: a reload that
    changes them (a file, its place, its scale) drops it, and the config's scales apply,
    so that an edit of the file is never silently overridden."""

    def __init__(self) -> None:
        self._set: dict[str, tuple[LoraView, tuple[float, ...]]] = {}

    def of(self, view: LoraView) -> tuple[float, ...]:
        held = self._set.get(view.name)
        if held is not None and held[0] == view:
            return held[1]
        self._set.pop(view.name, None)
        return tuple(a.scale for a in view.adapters)

    def put(self, view: LoraView, asked: Requested) -> None:
        """Set the name's scales as llama-server's POST does: each adapter named at its
        scale, every other at 0."""
        check_ids(view, asked, "", "id")
        scales = dict(asked)
        self._set[view.name] = (view, tuple(scales.get(i, 0.0) for i in range(len(view.adapters))))
