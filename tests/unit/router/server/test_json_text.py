"""router/server/json_text.py: JSON from a model or an upstream decoded as `json.loads`
decodes it, and nesting too deep to decode a ValueError like any other text that is not
JSON, never a RecursionError (the readers that use it: test_deep_json_output.py in
tests/unit/router/generation, tests/process/test_deep_json_upstreams.py)."""

from __future__ import annotations

import pytest

from router.server import json_text

N = 50_000
DEEP = "[" * N + "]" * N


@pytest.mark.parametrize("text", [DEEP, "{" + '"a":' * N + "1" + "}" * N, "[" * N])
def test_json_nested_50000_deep_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        json_text.loads(text)
    with pytest.raises(ValueError):
        json_text.loads(text.encode())


def test_json_text_decodes_as_json_loads_does() -> None:
    shallow = '{"a": [1, 2.5, "x", null, true, NaN], "b": {"c": []}}'
    assert repr(json_text.loads(shallow)) == repr(json_text.loads(shallow.encode())) == repr(
        {"a": [1, 2.5, "x", None, True, float("nan")], "b": {"c": []}})
    with pytest.raises(ValueError):
        json_text.loads('{"a": ')
