"""One reading of msgspec's validation errors, for request bodies and config files alike."""

from __future__ import annotations

import msgspec
import pytest

from supervisor.msgspec_errors import Problem, problem


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    role: str


class Outer(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    messages: list[Inner] = []


def _problem(doc: bytes) -> Problem:
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.json.decode(doc, type=Outer)
    return problem(info.value)


def test_a_wrong_type_deep_down() -> None:
    p = _problem(b'{"model": "m", "messages": [{"role": "user"}, {"role": 5}]}')
    assert p == Problem(message="Expected `str`, got `int`", path="messages[1].role")
    assert p.key == "messages[1].role"


def test_an_unknown_key_names_itself() -> None:
    p = _problem(b'{"model": "m", "messages": [{"role": "user", "x": 1}]}')
    assert (p.path, p.unknown, p.missing, p.key) == ("messages[0]", "x", None, "messages[0].x")
    assert _problem(b'{"model": "m", "y": 1}').key == "y"


def test_a_missing_key_names_itself() -> None:
    p = _problem(b'{"messages": []}')
    assert (p.path, p.missing, p.key) == ("", "model", "model")
    assert _problem(b'{"model": "m", "messages": [{}]}').key == "messages[0].role"


def test_the_top_level_has_no_path() -> None:
    p = _problem(b"[1, 2]")
    assert (p.path, p.key) == ("", "")
    assert p.message.startswith("Expected `object`")
