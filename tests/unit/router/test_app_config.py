"""The HTTP app's framework settings that decide whether long streams survive."""

from __future__ import annotations

from pathlib import Path

from router.app import create_app
from supervisor.config import parse
from supervisor.supervisor import Supervisor
from tests.harness import write_gguf


def _app(tmp_path: Path, server: str = ""):  # type: ignore[no-untyped-def]
    write_gguf(tmp_path / "m.gguf")
    cfg = parse(f'[server]\n{server}\n[models.m]\npath = "m.gguf"\n', tmp_path)
    return create_app(Supervisor(cfg), cfg)


def test_responses_have_no_framework_timeout(tmp_path: Path) -> None:
    # Quart's default RESPONSE_TIMEOUT (60 s) silently ends any longer stream.
    assert _app(tmp_path).config["RESPONSE_TIMEOUT"] is None


def test_body_limit_follows_config(tmp_path: Path) -> None:
    assert _app(tmp_path).config["MAX_CONTENT_LENGTH"] == 16 * 1024 * 1024
    assert _app(tmp_path, "max_body_bytes = 4096").config["MAX_CONTENT_LENGTH"] == 4096
