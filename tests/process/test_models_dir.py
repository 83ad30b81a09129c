"""`corral serve --models-dir DIR` with fake workers: no config file at all, every GGUF of
the folder served under its stem, and a SIGHUP that rescans the folder (a file added is
served, a file removed stops being served, a file still being copied in waits)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import trio

from corral.serve import serve
from supervisor.config import load
from tests.e2e.conftest import free_port
from tests.process.support import WORKER_COMMAND, expected_text
from tests.unit.supervisor.config.test_models_dir import gguf_bytes

ROOT = Path(__file__).resolve().parents[2]

# `corral serve` as its console script runs it, but with the fake worker in place of
# `python -m worker`: the command line, the config search and the signals are the real ones.
CORRAL_WITH_FAKE_WORKERS = (
    "import sys, supervisor.launcher as launcher; "
    f"launcher.default_worker_command = lambda: {WORKER_COMMAND!r}; "
    "from corral.main import main; sys.exit(main(sys.argv[1:]))"
)


def put(folder: Path, name: str) -> None:
    # Written beside and renamed in, as a careful copy would; the header is a real GGUF's.
    tmp = folder / f".{name}.tmp"
    tmp.write_bytes(gguf_bytes())
    tmp.rename(folder / name)


def listed(client: httpx.Client) -> list[str]:
    r = client.get("/v1/models")
    assert r.status_code == 200, r.text
    return sorted(m["id"] for m in r.json()["data"])


def complete(client: httpx.Client, model: str, n: int = 3) -> httpx.Response:
    return client.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": n})


def wait_until_listed(client: httpx.Client, want: list[str], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while (got := listed(client)) != want:
        assert time.monotonic() < deadline, f"/v1/models still lists {got}, not {want}"
        time.sleep(0.05)


@pytest.fixture
def no_config_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment in which the config search finds nothing."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_CONFIG", "XDG_CONFIG_HOME")}
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT)}


@pytest.fixture
def corral_serve_models_dir(tmp_path: Path, no_config_anywhere: dict[str, str]) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    folder = tmp_path / "models"
    folder.mkdir()
    put(folder, "alpha.gguf")
    put(folder, "beta.gguf")
    (folder / "README.txt").write_text("not a model")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", CORRAL_WITH_FAKE_WORKERS, "serve", "--models-dir", "models", "--port", str(port)],
        cwd=tmp_path, env=no_config_anywhere, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        yield proc, f"http://127.0.0.1:{port}", folder
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)


def test_serve_models_dir_without_a_config_file_and_sighup_rescans(
    corral_serve_models_dir: tuple[subprocess.Popen[str], str, Path],
) -> None:
    proc, url, folder = corral_serve_models_dir
    with httpx.Client(base_url=url, timeout=10) as client:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                client.get("/health")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "corral serve did not come up"
                time.sleep(0.1)
        assert listed(client) == ["alpha", "beta"]
        for model in ("alpha", "beta"):
            r = complete(client, model)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == expected_text(3)

        put(folder, "gamma.gguf")
        proc.send_signal(signal.SIGHUP)
        wait_until_listed(client, ["alpha", "beta", "gamma"])
        r = complete(client, "gamma", 2)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected_text(2)

        (folder / "alpha.gguf").unlink()
        proc.send_signal(signal.SIGHUP)
        wait_until_listed(client, ["beta", "gamma"])
        r = complete(client, "alpha")
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert complete(client, "beta").status_code == 200  # the others never noticed

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    err = proc.stderr.read() if proc.stderr else ""
    assert "no config file; serving the models of --models-dir with every default" in err
    assert "with 2 model(s): alpha, beta" in err


def test_models_dir_with_no_model_and_no_config_says_so(tmp_path: Path, no_config_anywhere: dict[str, str]) -> None:
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "corral", "serve", "--models-dir", "empty"],
        cwd=tmp_path, env=no_config_anywhere, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    assert f"server.models_dir: no *.gguf model in {tmp_path / 'empty'}" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "corral", "serve", "--models-dir", "nowhere"],
        cwd=tmp_path, env=no_config_anywhere, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1 and f"--models-dir: no such folder: {tmp_path / 'nowhere'}" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "corral", "serve", "--models-dir", ""],
        cwd=tmp_path, env=no_config_anywhere, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1 and "--models-dir: must not be empty" in done.stderr
    # Without --models-dir, a missing config is still an error.
    done = subprocess.run(
        [sys.executable, "-m", "corral", "serve"],
        cwd=tmp_path, env=no_config_anywhere, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1 and "no config file given (--config) and none found" in done.stderr


async def test_a_file_still_being_copied_in_is_not_served_until_it_stops_growing(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    put(folder, "a.gguf")
    cfg = tmp_path / "config.toml"
    # The file's own table overrides the folder's defaults for one model.
    cfg.write_text('[server]\nmodels_dir = "models"\n[supervisor]\nreload_settle = 0.2\n[models.a]\nslots = 2\n')
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(serve, load(cfg, {"port": 0}), worker_command=WORKER_COMMAND, server_overrides={"port": 0})
            )
            async with httpx.AsyncClient(base_url=binds[0], timeout=20) as c:
                models = (await c.get("/admin/models")).json()["models"]
                assert [(m["name"], m["slots"]) for m in models] == [("a", 2)]

                # A copy in progress: the header is there and the file keeps growing.
                growing = folder / "b.gguf"
                growing.write_bytes(gguf_bytes())
                stop_growing = trio.Event()

                async def copy_on() -> None:
                    with open(growing, "ab") as f:
                        while not stop_growing.is_set():
                            f.write(b"\0" * 1024)
                            f.flush()
                            await trio.sleep(0.05)

                nursery.start_soon(copy_on)
                answers: list[httpx.Response] = []

                async def reload() -> None:
                    answers.append(await c.post("/admin/reload"))

                nursery.start_soon(reload)
                # The reload waits for the folder to settle: while b grows, it is not served.
                await trio.sleep(1.0)
                assert answers == []
                assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == ["a"]
                stop_growing.set()
                with trio.fail_after(15):
                    while not answers:
                        await trio.sleep(0.05)
                assert answers[0].status_code == 200, answers[0].text
                assert answers[0].json()["added"] == ["b"] and answers[0].json()["unchanged"] == ["a"]
                assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == ["a", "b"]
                r = await c.post("/v1/completions", json={"model": "b", "prompt": "x", "max_tokens": 2})
                assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected_text(2)
            nursery.cancel_scope.cancel()


async def test_models_dir_on_the_command_line_wins_over_the_files_at_every_reload(tmp_path: Path) -> None:
    for sub, name in (("file", "from_file.gguf"), ("cli", "from_cli.gguf")):
        (tmp_path / sub).mkdir()
        put(tmp_path / sub, name)
    cfg = tmp_path / "config.toml"
    cfg.write_text('[server]\nmodels_dir = "file"\n[supervisor]\nreload_settle = 0.05\n')
    overrides: dict[str, object] = {"port": 0, "models_dir": str(tmp_path / "cli")}
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(serve, load(cfg, overrides), worker_command=WORKER_COMMAND, server_overrides=overrides)
            )
            async with httpx.AsyncClient(base_url=binds[0], timeout=20) as c:
                assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == ["from_cli"]
                put(tmp_path / "cli", "second.gguf")
                r = await c.post("/admin/reload")
                assert r.status_code == 200, r.text
                assert r.json() == {
                    "added": ["second"], "removed": [], "changed": [], "unchanged": ["from_cli"], "needs_restart": [],
                    "unloadable": {}, "upstreams_added": [], "upstreams_removed": [], "upstreams_changed": [],
                }
            nursery.cancel_scope.cancel()


async def test_a_folder_emptied_or_gone_fails_the_reload_and_keeps_the_old_models(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    put(folder, "a.gguf")
    overrides: dict[str, object] = {"port": 0, "models_dir": str(folder)}
    cfg = tmp_path / "config.toml"
    cfg.write_text("[supervisor]\nreload_settle = 0.05\n")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(serve, load(cfg, overrides), worker_command=WORKER_COMMAND, server_overrides=overrides)
            )
            async with httpx.AsyncClient(base_url=binds[0], timeout=20) as c:
                (folder / "a.gguf").unlink()
                r = await c.post("/admin/reload")
                assert r.status_code == 400, r.text
                assert f"server.models_dir: no *.gguf model in {folder}" in r.json()["error"]["message"]
                folder.rmdir()
                r = await c.post("/admin/reload")
                assert r.status_code == 400 and f"no such folder: {folder}" in r.json()["error"]["message"]
                assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == ["a"]
                folder.mkdir()
                put(folder, "b.gguf")
                r = await c.post("/admin/reload")
                assert r.status_code == 200 and (r.json()["added"], r.json()["removed"]) == (["b"], ["a"])
            nursery.cancel_scope.cancel()
