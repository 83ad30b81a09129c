"""Errors tell clients the model's name, never the server's file layout (issue 8,
finding 5): the real worker's load failures carried absolute paths into 503 bodies
("model file not found: /srv/models/x.gguf"). The log keeps the path."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from router.app import create_app
from supervisor.launcher import default_worker_command
from supervisor.supervisor import Supervisor
from tests.harness import make_config, running, write_gguf


async def _first_error(sup: Supervisor) -> tuple[int, str]:
    client = create_app(sup, sup.config).test_client()
    with trio.fail_after(60):
        async with running(sup):
            r = await client.post("/v1/completions", json={"model": "m", "prompt": "x"})
            return r.status_code, (await r.get_data()).decode()


@pytest.mark.parametrize("broken", ["missing", "not a gguf", "not a model llama.cpp knows"])
async def test_a_load_failure_names_the_model_not_the_path(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, broken: str
) -> None:
    gguf = tmp_path / "models" / "m.gguf"
    gguf.parent.mkdir()
    write_gguf(gguf)  # a whole GGUF file, of an architecture llama.cpp does not know
    cfg = make_config(tmp_path, {"m": {"path": "models/m.gguf"}}, start_retries=0)
    if broken == "missing":
        gguf.unlink(missing_ok=True)  # the config was checked while it existed
    elif broken == "not a gguf":
        gguf.write_bytes(b"this is not a GGUF file at all" * 100)
    with caplog.at_level(logging.ERROR):
        status, body = await _first_error(Supervisor(cfg, worker_command=default_worker_command()))
    assert status == 503
    assert "'m'" in body  # the model's name
    assert str(tmp_path) not in body and "m.gguf" not in body, body
    # The operator still learns which file: the supervisor's log names it (a file that
    # cannot load), or the real worker does on stderr (a load llama.cpp refused).
    assert str(gguf) in capfd.readouterr().err + "".join(r.getMessage() for r in caplog.records)


async def test_a_worker_that_cannot_be_spawned_names_no_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_config(tmp_path, {"m": {}}, start_retries=0)
    missing = tmp_path / "no" / "such" / "python"
    with caplog.at_level(logging.ERROR):
        status, body = await _first_error(Supervisor(cfg, worker_command=[str(missing), "-m", "worker"]))
    assert status == 503
    assert "could not start the worker process" in body
    assert str(tmp_path) not in body, body
    assert any(str(missing) in rec.getMessage() for rec in caplog.records)
