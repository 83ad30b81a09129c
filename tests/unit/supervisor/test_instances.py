"""`instances = N` (issue 43): the pure rules that name and sum a model's instances, the
config key's checks, and the shares of the cores each instance gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import parse
from supervisor.cores import divide_cores
from supervisor.instances import group_state, instance_spec, label
from supervisor.lifecycle import State
from tests.harness import config_problems, config_text, write_gguf

S = State


def test_the_first_instance_keeps_the_models_name_and_the_others_are_numbered() -> None:
    assert [label("m", i) for i in range(3)] == ["m", "m#1", "m#2"]


def test_an_instance_spec_is_the_models_under_its_label_without_aliases(tmp_path: Path) -> None:
    write_gguf(tmp_path / "dummy.gguf")
    spec = parse(config_text({"m": {"instances": 2, "aliases": ["a"], "slots": 3}}), tmp_path).models["m"]
    one = instance_spec(spec, 1)
    assert (one.name, one.aliases, one.slots, one.path) == ("m#1", (), 3, spec.path)
    assert instance_spec(spec, 0).name == "m"


@pytest.mark.parametrize(
    "states, shown",
    [
        ([S.READY, S.STOPPED], S.READY),  # one serves: the model serves
        ([S.FAILED, S.READY], S.READY),
        ([S.STOPPED, S.STARTING], S.STARTING),
        ([S.FAILED, S.BACKOFF], S.BACKOFF),
        ([S.FAILED, S.STOPPED], S.STOPPED),  # one may still load
        ([S.FAILED, S.FAILED], S.FAILED),  # failed only when every one has
        ([S.STOPPED, S.STOPPED], S.STOPPED),
    ],
)
def test_a_group_shows_ready_while_any_instance_serves_and_failed_only_when_all_have(
    states: list[State], shown: State
) -> None:
    assert group_state(states) is shown


@pytest.mark.parametrize("n", [0, 65, -1])
def test_config_check_refuses_instances_out_of_range_naming_the_key(tmp_path: Path, n: int) -> None:
    write_gguf(tmp_path / "dummy.gguf")
    problems = config_problems(config_text({"m": {"instances": n}}), tmp_path)
    assert any(p.startswith("models.m.instances: must be 1..64") for p in problems), problems


def test_pinned_instances_count_against_max_loaded_models(tmp_path: Path) -> None:
    write_gguf(tmp_path / "dummy.gguf")
    problems = config_problems(
        config_text({"m": {"instances": 3, "pinned": True}}, max_loaded_models=2), tmp_path
    )
    assert any(p.startswith("supervisor.max_loaded_models:") and "3 workers" in p for p in problems), problems


def test_two_instances_without_threads_get_half_the_cores_each() -> None:
    # The supervisor divides the cores by handle name, which is each instance's label.
    assert divide_cores(8, {"m": None, "m#1": None}) == {"m": 4, "m#1": 4}
    assert divide_cores(2, {"m": None, "m#1": None}) == {"m": 1, "m#1": 1}
