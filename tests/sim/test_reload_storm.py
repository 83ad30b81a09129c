"""Reload storms (issue 8, finding 4), on the virtual clock.

Twenty SIGHUPs in 2 s while the config file was being rewritten: a half-written file parsed
as valid TOML and was applied, removing one model and changing another; the final reload
restored the original file, yet the changed model went on draining and stopped. Now a
reload applies the file only once it has stopped changing, and a handle compares a new
spec with what its worker runs, so a restored config cancels the pending restart. No
request is lost either way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from supervisor.config import Config, ConfigError, load
from supervisor.lifecycle import State
from supervisor.supervisor import RELOAD_GIVE_UP, Supervisor
from tests.harness import config_text, running, write_config
from tests.sim.support import complete, until_state
from tests.behaviour import Behaviour
from tests.sim_worker import SimLauncher
from supervisor.systemd import Notifier

MODELS: dict[str, dict[str, object]] = {"a": {}, "b": {}, "c": {"slots": 2}}


class Recorder(Notifier):
    """What systemd would hear."""

    def __init__(self) -> None:
        super().__init__({})
        self.sent: list[tuple[str, ...]] = []

    def notify(self, *lines: str) -> None:
        self.sent.append(lines)


def file_supervisor(
    tmp_path: Path, behaviours: dict[str, Behaviour] | None = None, **settings: object
) -> tuple[Supervisor, SimLauncher, Path, Recorder]:
    path = write_config(tmp_path / "config.toml", MODELS, **settings)
    launcher = SimLauncher(behaviours)
    notifier = Recorder()
    return Supervisor(load(path), launcher=launcher, cores=8, notifier=notifier), launcher, path, notifier


def record_applied(sup: Supervisor) -> list[Config]:
    """Every config the supervisor applies, in order."""
    applied: list[Config] = []
    apply = sup.reload

    def recording(new: Config):  # type: ignore[no-untyped-def]
        applied.append(new)
        return apply(new)

    sup.reload = recording  # type: ignore[method-assign]
    return applied


async def write_slowly(path: Path, parts: list[str], gap: float) -> None:
    """Rewrite `path` in place, part by part, `gap` seconds apart, as a slow writer or a
    careless script does: between parts the file holds a prefix of the new text."""
    with path.open("w") as f:
        for part in parts:
            f.write(part)
            f.flush()
            await trio.sleep(gap)


async def test_a_storm_of_sighups_during_a_slow_rewrite_applies_only_the_whole_file(
    tmp_path: Path, autojump_clock: object
) -> None:
    """Issue 8, finding 4: a half-written file was applied. Fails with reload_settle = 0."""
    sup, launcher, path, _ = file_supervisor(tmp_path, reload_settle=0.5)
    applied = record_applied(sup)
    new = config_text({"a": {}, "b": {"slots": 3}, "c": {"slots": 2}}, reload_settle=0.5)
    # Cut just before b's table: that prefix is valid TOML with b missing, and c's table gone.
    cut = new.index('[models."b"]')
    assert load_text(tmp_path, new[:cut]).models.keys() == {"a"}
    async with running(sup), trio.open_nursery() as nursery:
        b_handle = sup.resolve("b")
        # For 0.3 s (less than reload_settle) the file is that valid, half-written prefix.
        nursery.start_soon(write_slowly, path, [new[:cut], new[cut:]], 0.3)
        for _ in range(20):  # twenty SIGHUPs in 2 s
            sup.request_reload()
            await trio.sleep(0.1)
        await trio.sleep(5)
    assert applied, "the rewrite was never applied"
    for cfg in applied:
        assert set(cfg.models) == {"a", "b", "c"}, "a half-written file was applied"
    assert sup.resolve("b") is b_handle and b_handle.spec.slots == 3
    assert len(applied) <= 3  # a storm comes down to a few reloads
    assert launcher.starts == []  # nothing was loaded or restarted along the way


def load_text(tmp_path: Path, text: str) -> Config:
    p = tmp_path / "probe.toml"
    p.write_text(text)
    return load(p)


async def test_a_reload_that_restores_a_models_settings_cancels_its_restart(
    tmp_path: Path, autojump_clock: object
) -> None:
    """The second half of the storm (issue 8, finding 4): c was marked changed by a
    half-written file, and kept draining after the final reload restored it."""
    behaviours = {"c": Behaviour(tokens_per_sec=1.0)}
    sup, launcher, path, _ = file_supervisor(tmp_path, behaviours, reload_settle=0.5)
    async with running(sup):
        c = sup.resolve("c")
        results: list[str] = []

        async def long_request() -> None:
            results.append(await complete(sup, "c", max_tokens=20))  # 20 s of decoding

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_request)
            await until_state(c, State.READY)
            write_config(path, {"a": {}, "b": {}, "c": {"slots": 4}}, reload_settle=0.5)
            assert (await sup.reload_settled()).changed == ("c",)
            await until_state(c, State.DRAINING)  # its request is still running
            write_config(path, MODELS, reload_settle=0.5)  # restored
            await sup.reload_settled()
            await until_state(c, State.READY)
            assert c.spec.slots == 2 and not c.leaving and results == []
        assert len(results) == 1 and results[0]  # the request finished, untouched
        await trio.sleep(60)
        assert c.state is State.READY  # and the worker stays
        assert [s.name for s in launcher.starts] == ["c"]  # one worker, never restarted


async def test_a_model_removed_then_added_back_keeps_its_worker(
    tmp_path: Path, autojump_clock: object
) -> None:
    behaviours = {"b": Behaviour(tokens_per_sec=1.0)}
    sup, launcher, path, _ = file_supervisor(tmp_path, behaviours, reload_settle=0.5)
    async with running(sup):
        b = sup.resolve("b")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(complete, sup, "b", 20)
            await until_state(b, State.READY)
            write_config(path, {"a": {}, "c": {"slots": 2}}, reload_settle=0.5)
            assert (await sup.reload_settled()).removed == ("b",)
            await until_state(b, State.DRAINING)
            write_config(path, MODELS, reload_settle=0.5)
            assert (await sup.reload_settled()).added == ("b",)
            assert sup.resolve("b") is b
            await until_state(b, State.READY)
        await complete(sup, "b", max_tokens=1)  # still served, by the same worker
        assert [s.name for s in launcher.starts] == ["b"]


async def test_a_file_that_never_stops_changing_is_refused(
    tmp_path: Path, autojump_clock: object
) -> None:
    sup, _, path, notifier = file_supervisor(tmp_path, reload_settle=0.5)
    async with running(sup), trio.open_nursery() as nursery:

        async def keep_changing() -> None:
            for i in range(1000):
                write_config(path, {**MODELS, f"m{i}": {}}, reload_settle=0.5)
                await trio.sleep(0.2)

        nursery.start_soon(keep_changing)
        started = trio.current_time()
        with pytest.raises(ConfigError) as info:
            await sup.reload_settled()
        assert trio.current_time() - started == pytest.approx(RELOAD_GIVE_UP, abs=0.6)
        assert "still changing" in info.value.problems[0] and "rename" in info.value.problems[0]
        assert set(sup.handles) == {"a", "b", "c"}  # the old config runs on
        assert sup.config_error is not None and "still changing" in sup.config_error
        nursery.cancel_scope.cancel()
    # systemd heard the reload start and end, in that order.
    reloading = [i for i, lines in enumerate(notifier.sent) if lines[0] == "RELOADING=1"]
    ready = [i for i, lines in enumerate(notifier.sent) if lines[0] == "READY=1"]
    assert reloading and ready and reloading[0] < ready[0]


async def test_a_reload_answers_with_a_file_read_after_the_request(
    tmp_path: Path, autojump_clock: object
) -> None:
    sup, _, path, _ = file_supervisor(tmp_path, reload_settle=0.5)
    async with running(sup):
        first = trio.current_time()
        assert (await sup.reload_settled()).changed == ()
        assert trio.current_time() - first >= 0.5  # it waited for the file to settle
        write_config(path, {**MODELS, "d": {}}, reload_settle=0.5)
        assert (await sup.reload_settled()).added == ("d",)
        # Concurrent callers share a reload and all see its result.
        write_config(path, MODELS, reload_settle=0.5)
        diffs = []

        async def ask() -> None:
            diffs.append(await sup.reload_settled())

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(ask)
        assert len(diffs) == 5 and all(d.removed == ("d",) for d in diffs)


async def test_a_reload_of_generation_defaults_keeps_the_worker(tmp_path: Path, autojump_clock: object) -> None:
    """A model's generation defaults (issue 22, item 1), its queue limits and aliases are
    the router's: a reload that changes only them applies at once, and the worker, with its
    request in flight and its warm cache, keeps running (issue 24, item 5: max_queue,
    queue_timeout, max_tokens and the sampling defaults live). One that changes slots still
    restarts it."""
    behaviours = {"c": Behaviour(tokens_per_sec=1.0)}
    sup, launcher, path, _ = file_supervisor(tmp_path, behaviours, reload_settle=0.5)
    async with running(sup):
        c = sup.resolve("c")
        results: list[str] = []

        async def long_request() -> None:
            results.append(await complete(sup, "c", max_tokens=20))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_request)
            await until_state(c, State.READY)
            changed = {
                "slots": 2, "temperature": 0.1, "seed": 7, "stop": ["END"], "aliases": ["cc"], "max_tokens": 9,
                "max_queue": 3, "queue_timeout": 2.5, "top_k": 5,
            }
            write_config(path, {"a": {}, "b": {}, "c": changed}, reload_settle=0.5)
            assert (await sup.reload_settled()).changed == ("c",)
            await trio.sleep(1)  # the model's run loop adopts it
            assert c.state is State.READY and not c.leaving
            d = c.spec.defaults
            assert (d.temperature, d.seed, d.stop, d.top_k) == (0.1, 7, ["END"], 5)
            assert (c.spec.max_tokens, c.spec.max_queue, c.spec.queue_timeout) == (9, 3, 2.5)
            assert sup.resolve("cc") is c
        assert len(results) == 1 and results[0]
        assert [s.name for s in launcher.starts] == ["c"]
        write_config(path, {"a": {}, "b": {}, "c": {**changed, "slots": 3}}, reload_settle=0.5)
        await sup.reload_settled()
        await trio.sleep(5)  # the old worker stops (nothing in flight)
        await complete(sup, "c", max_tokens=1)  # loads it again, with the new slots
        assert [s.name for s in launcher.starts] == ["c", "c"] and c.spec.slots == 3
