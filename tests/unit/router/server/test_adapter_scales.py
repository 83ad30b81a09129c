"""POST /lora-adapters' scales (router/server/adapter_scales.py): llama-server's way of
setting them, and what a reload does to them (issue 45)."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.server.adapter_scales import Scales
from supervisor.config.lora_views import Adapter, LoraView
from supervisor.errors import InvalidRequest


def view(*scales: float, path: str = "a.gguf") -> LoraView:
    return LoraView("bot", "m", tuple(Adapter(i, Path(f"{i}-{path}"), s) for i, s in enumerate(scales)))


def test_a_post_sets_the_named_and_zeroes_the_rest() -> None:
    scales = Scales()
    v = view(0.5, 1.0)
    assert scales.of(v) == (0.5, 1.0)  # the config's until set
    scales.put(v, ((1, 0.25),))
    assert scales.of(v) == (0.0, 0.25)
    with pytest.raises(InvalidRequest) as info:
        scales.put(v, ((2, 1.0),))
    assert info.value.param == "id" and info.value.message.startswith("[0].id: ")
    assert scales.of(v) == (0.0, 0.25)  # nothing set by the refused one


def test_a_config_that_changes_the_names_adapters_drops_what_was_set() -> None:
    scales = Scales()
    scales.put(view(0.5), ((0, 0.9),))
    assert scales.of(view(0.5)) == (0.9,)  # a reload that changed nothing keeps it
    assert scales.of(view(0.3)) == (0.3,)  # another scale in the file: the file's
    # ... and it stays dropped when the file goes back (found by a hostile probe: the old
    # override had come back after two reloads).
    assert scales.of(view(0.5)) == (0.5,)
    scales.put(view(0.5), ((0, 0.9),))
    assert scales.of(view(0.5, path="b.gguf")) == (0.5,)  # another file
