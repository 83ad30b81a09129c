"""The reload diff: models compared as whole resolved specs; server changes reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import parse
from supervisor.reload import diff
from tests.harness import write_gguf


def _cfg(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    write_gguf(tmp_path / "m.gguf")
    return parse(text, tmp_path)


def test_added_removed_changed_unchanged(tmp_path: Path) -> None:
    old = _cfg(tmp_path, '[models.a]\npath="m.gguf"\n[models.c]\npath="m.gguf"\n[models.d]\npath="m.gguf"\n')
    new = _cfg(tmp_path, '[models.a]\npath="m.gguf"\n[models.b]\npath="m.gguf"\n[models.c]\npath="m.gguf"\nslots=2\n')
    d = diff(old, new)
    assert (d.added, d.removed, d.changed, d.unchanged) == (("b",), ("d",), ("c",), ("a",))
    assert d.needs_restart == ()
    assert d.summary() == "added b; removed d; changed c"


def test_inherited_idle_timeout_change_counts_as_a_model_change(tmp_path: Path) -> None:
    old = _cfg(tmp_path, '[models.a]\npath="m.gguf"\n')
    new = _cfg(tmp_path, '[supervisor]\nidle_timeout=5\n[models.a]\npath="m.gguf"\n')
    assert diff(old, new).changed == ("a",)


def test_alias_change_is_a_change_and_server_changes_need_a_restart(tmp_path: Path) -> None:
    old = _cfg(tmp_path, '[models.a]\npath="m.gguf"\n')
    new = _cfg(tmp_path, '[server]\nport=9000\n[models.a]\npath="m.gguf"\naliases=["x"]\n')
    d = diff(old, new)
    assert d.changed == ("a",) and d.needs_restart == ("server.port",)
    assert diff(old, old).summary() == "no changes"


def test_default_model_applies_on_reload_without_a_restart(tmp_path: Path) -> None:
    old = _cfg(tmp_path, '[models.a]\npath="m.gguf"\n[models.b]\npath="m.gguf"\n')
    new = _cfg(tmp_path, '[server]\ndefault_model="b"\n[models.a]\npath="m.gguf"\n[models.b]\npath="m.gguf"\n')
    assert diff(old, new).needs_restart == ()
    assert new.server.default_model == "b"


def test_a_server_change_is_reported_until_the_process_restarts(tmp_path: Path) -> None:
    """Pins a544836: the diff compared with the previous config, not with what the socket
    was opened with, so a second reload forgot that a port change still needed a restart."""
    started = _cfg(tmp_path, '[models.a]\npath="m.gguf"\n')
    moved = _cfg(tmp_path, '[server]\nport=9000\n[models.a]\npath="m.gguf"\n')
    assert diff(started, moved, started.server).needs_restart == ("server.port",)
    # The running config is now `moved`, but the socket still listens on the first port.
    assert diff(moved, moved, started.server).needs_restart == ("server.port",)
    assert diff(moved, started, started.server).needs_restart == ()  # the file went back


def test_models_served_elsewhere_are_reported_apart_from_the_workers(tmp_path: Path) -> None:
    """A reload that adds, drops or re-points upstream models says so (a probe found every
    such reload reported as "no changes"), and names no worker to start or stop for them."""
    old = _cfg(tmp_path, '[models.a]\npath="m.gguf"\n[models.u]\nupstream="http://h1/v1"\n[models.v]\nupstream="http://h/v1"\n')
    new = _cfg(tmp_path, '[models.a]\npath="m.gguf"\n[models.u]\nupstream=["http://h1/v1", "http://h2/v1"]\n[models.w]\nupstream="http://h/v1"\n')
    d = diff(old, new)
    assert (d.added, d.removed, d.changed, d.unchanged) == ((), (), (), ("a",))
    assert (d.upstreams_added, d.upstreams_removed, d.upstreams_changed) == (("w",), ("v",), ("u",))
    assert d.summary() == "added upstream w; removed upstream v; changed upstream u"


@pytest.mark.parametrize(
    "setting",
    [
        'slot_save_path = "slots"', "slot_save_max_bytes = 1000", 'slot_actions = "keys"', "responses_ttl = 5",
        "responses_max_bytes = 1000", "models_autoload = false",
    ],
)
def test_settings_read_at_each_request_are_not_reported_as_needing_a_restart(tmp_path: Path, setting: str) -> None:
    # Issue 40: a reload answered needs_restart: ["server.slot_save_path"] while the new
    # folder was already in use. Each of these is read from the live config per request.
    (tmp_path / "slots").mkdir()
    old = _cfg(tmp_path, '[models.a]\npath="m.gguf"\n')
    new = _cfg(tmp_path, f'[server]\n{setting}\n[models.a]\npath="m.gguf"\n')
    assert new.server != old.server
    assert diff(old, new).needs_restart == ()


def test_an_adapter_models_scale_is_the_routers_and_restarts_no_worker(tmp_path: Path) -> None:
    """Issue 45: scales are applied by the router from the next request; the base's worker
    restarts only when the adapter files it loads change."""
    from bench import lora_adapter
    from tests.unit.supervisor.config.test_lora import base_model

    base_model(tmp_path / "m.gguf")
    for name, seed in (("a.gguf", 1), ("b.gguf", 2)):
        lora_adapter.write(tmp_path / "m.gguf", tmp_path / name, seed=seed, rank=2)
    table = '[models.m]\npath = "m.gguf"\nlora = [{{ path = "a.gguf" }}]\n[models.bot]\nbase = "m"\nlora = [{{ path = "{}", scale = {} }}]\n'
    old = parse(table.format("a.gguf", 0.5), tmp_path)
    rescaled = diff(old, parse(table.format("a.gguf", 0.3), tmp_path))
    assert (rescaled.changed, rescaled.adapters_changed) == ((), ("bot",))
    assert rescaled.summary() == "changed adapters of bot"
    another = diff(old, parse(table.format("b.gguf", 0.5), tmp_path))
    assert another.changed == ("m",) and another.adapters_changed == ("bot",)  # m's worker loads b.gguf now
