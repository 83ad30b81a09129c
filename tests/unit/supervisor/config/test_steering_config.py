"""The settings behind issue 40, finding 5: a model's `max_tokens_limit` (llama-server's -n
as a cap) and `[server] max_keep_alive`, as `corral config check`, a reload and
`corral config import-preset` read them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from supervisor.config import ConfigError, parse
from supervisor.config.presets import import_preset
from supervisor.reload import diff
from tests.harness import write_gguf

MODEL = '[models.a]\npath = "m.gguf"\n'


@pytest.fixture
def base(tmp_path: Path) -> Path:
    write_gguf(tmp_path / "m.gguf")
    return tmp_path


def _problems(text: str, base: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text, base)
    return info.value.problems


def test_max_tokens_limit_reaches_the_models_spec_and_model_defaults_give_it(base: Path) -> None:
    assert parse(MODEL + "max_tokens_limit = 4096\n", base).models["a"].max_tokens_limit == 4096
    assert parse(MODEL, base).models["a"].max_tokens_limit is None
    text = "[model_defaults]\nmax_tokens_limit = 2048\n" + MODEL
    assert parse(text, base).models["a"].max_tokens_limit == 2048


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ("max_tokens_limit = 0", "models.a.max_tokens_limit: must be at least 1, got 0"),
        (
            "max_tokens_limit = 512\nmax_tokens = 1024",
            "models.a.max_tokens: 1024 is above max_tokens_limit (512), which caps every request",
        ),
        (
            "max_tokens_limit = 512\nn_predict = 600",
            "models.a.n_predict: 600 is above max_tokens_limit (512), which caps every request",
        ),
    ],
)
def test_config_check_holds_max_tokens_limit_to_its_sense(base: Path, lines: str, problem: str) -> None:
    assert _problems(MODEL + lines + "\n", base) == [problem]


def test_a_default_within_the_limit_and_no_limit_asked_are_fine(base: Path) -> None:
    for lines in ("max_tokens_limit = 512\nmax_tokens = 512", "max_tokens_limit = 512\nn_predict = -1"):
        assert parse(MODEL + lines + "\n", base).models["a"].max_tokens_limit == 512


def test_max_keep_alive_is_a_duration_that_applies_on_reload(base: Path) -> None:
    assert parse("[server]\nmax_keep_alive = \"30m\"\n" + MODEL, base).server.max_keep_alive == 1800
    assert parse(MODEL, base).server.max_keep_alive is None  # the model's idle_timeout
    assert _problems("[server]\nmax_keep_alive = -1\n" + MODEL, base) == [
        "server.max_keep_alive: must be a finite number >= 0 (0: no bound), got -1.0"
    ]
    old, new = parse(MODEL, base), parse("[server]\nmax_keep_alive = 60\n" + MODEL, base)
    assert diff(old, new).needs_restart == ()


def test_import_preset_maps_n_predict_to_the_default_and_the_cap() -> None:
    """llama-server's -n is both the default of a request that sets none and the most one
    may ask (a larger n_predict is cut to it); -1 is no limit, and caps nothing."""
    text = import_preset("[a]\nn = 512\n[b]\nn-predict = -1\n[*]\nLLAMA_ARG_N_PREDICT = 256\n", "p.ini")
    data = tomllib.loads(text)
    assert data["models"]["a"] == {"n_predict": 512, "max_tokens_limit": 512}
    assert data["models"]["b"] == {"n_predict": -1}
    assert data["model_defaults"] == {"n_predict": 256, "max_tokens_limit": 256}
    assert "max_tokens_limit = 512 # n = 512 (p.ini:2)" in text
