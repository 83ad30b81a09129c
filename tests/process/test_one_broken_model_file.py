"""One model file that cannot load fails that model alone (issue 20, item 4).

On 8ad3c96, `corral serve` with twenty models and one bad download served none of them: the
config check refused the whole file ("models.broken.path: no such file: ..."), and a reload
that met one did not apply the rest. Here the whole server runs (router, supervisor, fake
workers); `corral status` and `corral config check` run as subprocesses.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from corral.serve import serve
from supervisor.config import load
from tests.harness import write_config, write_gguf
from tests.process.support import WORKER_COMMAND, StartLog, corral, err, out

REASON = "the model file cannot load: no such file"


def _broken(how: str, path: Path) -> None:
    if how == "not a gguf":
        path.write_text("<html>502 Bad Gateway</html>\n")
    elif how == "truncated":
        write_gguf(path)
        path.write_bytes(path.read_bytes()[:-2])


async def test_a_server_with_one_missing_model_file_serves_the_others_and_says_why(
    tmp_path: Path, start_log: StartLog, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(
        tmp_path / "corral.toml", {"good": {}, "broken": {"path": "gone.gguf"}}, reload_settle=0.05
    )
    caplog.set_level(logging.INFO, logger="corral")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(serve, load(path), worker_command=WORKER_COMMAND, server_overrides={"port": 0})
            )
            url = binds[0]
            async with httpx.AsyncClient(base_url=url, timeout=10) as c:
                r = await c.post("/v1/completions", json={"model": "good", "prompt": "x", "max_tokens": 2})
                assert r.status_code == 200, r.text

                # Failed from the start, before anyone asked for it, with the reason.
                entry = (await c.get("/v1/models/broken")).json()
                assert (entry["state"], entry["last_error"]) == ("failed", REASON)
                assert "last_error" not in (await c.get("/v1/models/good")).json()
                admin = (await c.get("/admin/models/broken")).json()["model"]
                assert (admin["state"], admin["last_error"]) == ("failed", REASON)
                metrics = (await c.get("/metrics")).text
                assert 'corral_model_state{model="broken",state="failed"} 1.0' in metrics
                assert f'corral_model_failed_info{{error="{REASON}",model="broken"}} 1.0' in metrics
                assert metrics.count("corral_model_failed_info{") == 1  # the good model has none

                # Requests get a 503 that names the reason and says not to retry; the
                # path stays in the log.
                r = await c.post("/v1/chat/completions", json={
                    "model": "broken", "messages": [{"role": "user", "content": "hi"}],
                })
                message = r.json()["error"]["message"]
                assert (r.status_code, r.headers["x-should-retry"]) == (503, "false")
                assert REASON in message and str(tmp_path) not in message
                logged = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
                assert any(
                    m.startswith("broken: failed, its file cannot load") and str(tmp_path / "gone.gguf") in m
                    for m in logged
                ), logged

                done = await corral("status", "--url", url, cwd=tmp_path)
                assert done.returncode == 0, err(done)
                row = next(line for line in out(done).splitlines() if line.startswith("broken"))
                assert "failed" in row and "no such file" in row, out(done)

                # The file stays wrong as far as `config check` is concerned.
                done = await corral("config", "check", str(path), cwd=tmp_path)
                assert done.returncode == 1
                assert err(done).splitlines() == [f"{path}: models.broken.path: no such file: {tmp_path / 'gone.gguf'}"]

                # A reset with the file still missing fails again at once, with no worker.
                assert (await c.post("/admin/models/broken/reset")).json()["reset"] is True
                assert (await c.get("/v1/models/broken")).json()["state"] == "failed"

                # Mended, a reload retries it, and the reload's answer no longer lists it.
                write_gguf(tmp_path / "gone.gguf")
                r = await c.post("/admin/reload")
                assert r.status_code == 200 and r.json()["unloadable"] == {}, r.text
                r = await c.post("/v1/completions", json={"model": "broken", "prompt": "x", "max_tokens": 2})
                assert r.status_code == 200, r.text
                assert sorted(name for name, _ in start_log.entries()) == ["broken", "good"]
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("how", ["not a gguf", "truncated"])
async def test_a_reload_that_meets_a_broken_file_applies_everything_else(
    tmp_path: Path, start_log: StartLog, how: str
) -> None:
    path = write_config(tmp_path / "corral.toml", {"a": {}}, reload_settle=0.05)
    _broken(how, tmp_path / "bad.gguf")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(serve, load(path), worker_command=WORKER_COMMAND, server_overrides={"port": 0})
            )
            async with httpx.AsyncClient(base_url=binds[0], timeout=10) as c:
                write_config(path, {"a": {"aliases": ["first"]}, "b": {}, "bad": {"path": "bad.gguf"}},
                             reload_settle=0.05)
                r = await c.post("/admin/reload")
                assert r.status_code == 200, r.text
                d = r.json()
                assert (d["added"], d["changed"], list(d["unloadable"])) == (["b", "bad"], ["a"], ["bad"])
                assert "not a GGUF model file" in d["unloadable"]["bad"]
                for model in ("first", "b"):
                    r = await c.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2})
                    assert r.status_code == 200, r.text
                r = await c.post("/v1/completions", json={"model": "bad", "prompt": "x", "max_tokens": 2})
                assert r.status_code == 503 and "not a GGUF model file" in r.json()["error"]["message"]
                assert "bad" not in {name for name, _ in start_log.entries()}  # no worker was tried
            nursery.cancel_scope.cancel()


def test_a_typo_in_the_toml_still_refuses_the_whole_file(tmp_path: Path) -> None:
    """Only a model file is tolerated: a config mistake still stops serve, as before."""
    path = write_config(tmp_path / "corral.toml", {"a": {"slots": "ten"}, "b": {"path": "gone.gguf"}})
    done = subprocess.run([sys.executable, "-m", "corral", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f'{path}: models.a.slots: expected an integer, got "ten"',
        f"{path}: models.b.path: no such file: {tmp_path / 'gone.gguf'}",
    ]
