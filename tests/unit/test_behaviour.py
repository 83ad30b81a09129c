"""The fake worker's FAKE_* environment rules (tests/behaviour.py). The process tests set
these variables by the dozen; a change in precedence or in what counts as "set" would make
them test something else without failing."""

from __future__ import annotations

import pytest

from tests.behaviour import Behaviour, env_key


def test_no_variables_is_a_healthy_worker() -> None:
    assert Behaviour.from_env("a", {}) == Behaviour()
    assert Behaviour().tokens_per_sec == 200.0


def test_every_flag_is_read_from_its_global_variable() -> None:
    env = {
        "FAKE_LOAD_DELAY": "1.5",
        "FAKE_FAIL_LOAD": "no such tensor",
        "FAKE_EXIT_AT_START": "1",
        "FAKE_TOKENS_PER_SEC": "50",
        "FAKE_HANG": "yes",
        "FAKE_IGNORE_SHUTDOWN": "true",
        "FAKE_START_LOG": "/tmp/starts",
        "FAKE_ALLOC_MB": "64",
        "FAKE_CRASH_AFTER": "3",
        "FAKE_IGNORE_SIGTERM": "on",
    }
    assert Behaviour.from_env("a", env) == Behaviour(
        load_delay=1.5,
        fail_load="no such tensor",
        exit_at_start=True,
        tokens_per_sec=50.0,
        hang=True,
        ignore_shutdown=True,
        start_log="/tmp/starts",
        alloc_mb=64.0,
        crash_after=3,
        ignore_sigterm=True,
    )


def test_the_per_model_value_wins_over_the_global_one() -> None:
    env = {"FAKE_CRASH_AFTER": "3", "FAKE_CRASH_AFTER__b": "7"}
    assert Behaviour.from_env("a", env).crash_after == 3
    assert Behaviour.from_env("b", env).crash_after == 7


def test_an_empty_value_means_unset() -> None:
    # Empty per-model: the global is switched off for that model, not inherited.
    env = {"FAKE_CRASH_AFTER": "3", "FAKE_CRASH_AFTER__other": "", "FAKE_LOAD_DELAY": ""}
    assert Behaviour.from_env("other", env).crash_after is None
    assert Behaviour.from_env("a", env).crash_after == 3
    assert Behaviour.from_env("a", env).load_delay == 0.0  # empty global: the default
    assert Behaviour.from_env("a", {"FAKE_FAIL_LOAD": ""}).fail_load is None
    off_for_a = {"FAKE_EXIT_AT_START": "1", "FAKE_EXIT_AT_START__a": ""}
    assert Behaviour.from_env("a", off_for_a).exit_at_start is False


def test_the_per_model_suffix_replaces_every_non_alphanumeric_character() -> None:
    assert env_key("org/Qwen-2.5:7b") == "org_Qwen_2_5_7b"
    env = {"FAKE_HANG__org_Qwen_2_5_7b": "1"}
    assert Behaviour.from_env("org/Qwen-2.5:7b", env).hang is True
    assert Behaviour.from_env("org_qwen_2_5_7b", env).hang is False  # case is kept


@pytest.mark.parametrize("value", ["0", "false", "FALSE", "no", "off", " Off "])
def test_booleans_are_false_for_the_usual_words(value: str) -> None:
    assert Behaviour.from_env("a", {"FAKE_HANG": value}).hang is False


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "anything"])
def test_booleans_are_true_for_anything_else(value: str) -> None:
    assert Behaviour.from_env("a", {"FAKE_IGNORE_SIGTERM": value}).ignore_sigterm is True


@pytest.mark.parametrize("value", ["1", "true", "YES", " yes "])
def test_fail_load_without_a_message_says_fake_load_failure(value: str) -> None:
    assert Behaviour.from_env("a", {"FAKE_FAIL_LOAD": value}).fail_load == "fake load failure"


def test_fail_load_keeps_any_other_text_as_the_message() -> None:
    # "on" is true for booleans but is not one of fail_load's three shorthands.
    assert Behaviour.from_env("a", {"FAKE_FAIL_LOAD": "on"}).fail_load == "on"
    assert Behaviour.from_env("a", {"FAKE_FAIL_LOAD": "0"}).fail_load == "0"
