"""A worker logs at the level its parent hands down (worker/log_format.py): `corral serve
--log-level warning` quiets the workers too, and `corral chat`'s write nothing under its
prompt but warnings (issue 41, item 5)."""

from __future__ import annotations

import logging

import pytest

from worker import log_format


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR])
def test_the_level_handed_down_is_the_level_read(monkeypatch: pytest.MonkeyPatch, level: int) -> None:
    # Set through monkeypatch first, so that what hand_down writes is undone after the test.
    monkeypatch.setenv(log_format.ENV, "text")
    monkeypatch.setenv(log_format.LEVEL_ENV, "INFO")
    log_format.hand_down(level, "json")
    assert log_format.level_from_environment() == level
    assert log_format.from_environment() == "json"


@pytest.mark.parametrize("value", [None, "", "loud", "15"])
def test_no_level_or_a_strange_one_is_info(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(log_format.LEVEL_ENV, raising=False)
    else:
        monkeypatch.setenv(log_format.LEVEL_ENV, value)
    assert log_format.level_from_environment() == logging.INFO
