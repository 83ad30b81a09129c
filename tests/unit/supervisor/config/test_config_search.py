"""The config search path: --config, $CORRAL_CONFIG, ./corral.toml, ~/.config, /etc."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import ConfigError
from supervisor.config.search import find


def test_explicit_wins_over_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corral.toml").write_text("")
    assert find("other.toml", {"CORRAL_CONFIG": "x.toml"}) == (Path("other.toml"), "--config")


def test_env_then_cwd_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    (home / ".config" / "corral").mkdir(parents=True)
    (home / ".config" / "corral" / "config.toml").write_text("")
    env = {"HOME": str(home)}
    assert find(None, env)[0] == home / ".config" / "corral" / "config.toml"
    (tmp_path / "corral.toml").write_text("")
    assert find(None, env)[0] == Path("corral.toml")
    named = tmp_path / "named.toml"
    named.write_text("")
    assert find(None, {**env, "CORRAL_CONFIG": str(named)}) == (named, "$CORRAL_CONFIG")


def test_a_missing_env_file_is_an_error_not_a_fall_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corral.toml").write_text("")
    with pytest.raises(ConfigError, match=r"\$CORRAL_CONFIG names .*gone.toml, which is not a file"):
        find(None, {"CORRAL_CONFIG": str(tmp_path / "gone.toml")})


def test_nothing_found_names_every_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        find(None, {"HOME": str(tmp_path)})
    assert "corral.toml" in str(caught.value) and str(tmp_path / ".config" / "corral" / "config.toml") in str(caught.value)
