"""`corral config ... --reload` against the whole server (`corral serve`'s own serve(), with
fake workers): POST /admin/reload with the admin key, SIGHUP to the pid file's pid, and
a server reloading as fast as it is asked while `config set` rewrites its file: it never
reads a half-written file and ends on the last edit."""

from __future__ import annotations

import os
import signal
import tomllib
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
import trustme

from corral.main import main
from corral.serve import serve
from supervisor.config import ConfigError, load
from tests.e2e.conftest import free_port
from tests.harness import write_config
from tests.process.support import WORKER_COMMAND
from tests.secrets import secret


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ("CORRAL_CONFIG", "CORRAL_URL", "CORRAL_ADMIN_KEY", "CORRAL_API_KEYS"):
        monkeypatch.delenv(env, raising=False)


async def corral(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`corral ARGS` in a thread (it blocks on HTTP while the server runs in this loop)."""
    rc = await trio.to_thread.run_sync(main, list(args))
    out, err = capsys.readouterr()
    return rc, out, err


async def test_reload_over_http_with_the_admin_key_reports_the_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = secret("reload-admin")
    path = write_config(
        tmp_path / "corral.toml", {"a": {}}, {"port": free_port(), "admin_keys": [admin]}, reload_settle=0.05
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve, load(path), worker_command=WORKER_COMMAND))
            # No key: the server says 401, the file is written, the exit status says so.
            rc, out, err = await corral(capsys, "config", "set", "--config", str(path), "models.a.slots", "2", "--reload")
            assert rc == 3 and "401" in err and "the file is written" in err, err
            assert tomllib.loads(path.read_text())["models"]["a"]["slots"] == 2

            monkeypatch.setenv("CORRAL_ADMIN_KEY", admin)
            rc, out, err = await corral(
                capsys, "config", "add-model", "--config", str(path), "b", str(tmp_path / "dummy.gguf"), "--reload"
            )
            assert rc == 0, err
            # a's slots changed by the first, unreloaded edit; b is new.
            assert "reload: added: b" in out and "reload: changed: a" in out and "removed" not in out

            # The key may come from a file instead; a port change is reported as needing a restart.
            monkeypatch.delenv("CORRAL_ADMIN_KEY")
            key_file = tmp_path / "admin.key"
            key_file.write_text(admin + "\n")
            rc, out, err = await corral(
                capsys, "config", "remove-model", "--config", str(path), "b", "--reload",
                "--admin-key-file", str(key_file), "--url", f"http://127.0.0.1:{load(path).server.port}",
            )
            assert rc == 0 and "reload: removed: b" in out, err

            # A new port: the server still listens on the old one, which is where it is told.
            old_port = load(path).server.port
            monkeypatch.setenv("CORRAL_ADMIN_KEY", admin)
            rc, out, err = await corral(capsys, "config", "set", "--config", str(path), "server.port", str(free_port()), "--reload")
            assert rc == 0, err
            assert f"POST http://127.0.0.1:{old_port}/admin/reload" in out and "reload: needs restart: server.port" in out
            nursery.cancel_scope.cancel()


async def test_reload_uses_https_when_the_config_sets_tls_cert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))  # the CA a site would install
    path = write_config(
        tmp_path / "corral.toml", {"a": {}},
        {"port": free_port(), "tls_cert": "server.pem", "tls_key": "key.pem"}, reload_settle=0.05,
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve, load(path), worker_command=WORKER_COMMAND))
            rc, out, err = await corral(capsys, "config", "set", "--config", str(path), "models.a.slots", "2", "--reload")
            assert rc == 0, err
            assert f"POST https://127.0.0.1:{load(path).server.port}/admin/reload" in out and "changed: a" in out
            # A certificate nobody vouches for is not talked to (nor signalled around).
            monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "key.pem"))
            rc, out, err = await corral(capsys, "config", "set", "--config", str(path), "models.a.slots", "3", "--reload")
            assert rc == 3 and "CERTIFICATE_VERIFY_FAILED" in err, err
            nursery.cancel_scope.cancel()


async def test_reload_of_an_unreachable_server_without_pid_file_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path / "corral.toml", {"a": {}}, {"port": free_port()})
    rc, out, err = await corral(capsys, "config", "set", "--config", str(path), "models.a.slots", "3", "--reload")
    assert rc == 3 and "cannot connect" in err and "no [server] pid_file" in err
    assert tomllib.loads(path.read_text())["models"]["a"]["slots"] == 3


async def test_pid_file_is_written_at_start_removed_at_exit_and_sighup_reloads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pid_path = tmp_path / "run" / "corral.pid"
    pid_path.parent.mkdir()
    path = write_config(
        tmp_path / "corral.toml", {"a": {}}, {"port": free_port(), "pid_file": "run/corral.pid"}, reload_settle=0.05
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve, load(path), worker_command=WORKER_COMMAND))
            assert pid_path.read_text() == f"{os.getpid()}\n"
            # --signal: SIGHUP (to this test process, which is the server), reported from
            # the server's event stream.
            rc, out, err = await corral(
                capsys, "config", "set", "--config", str(path), "models.a.n_ctx", "1024", "--reload", "--signal"
            )
            assert rc == 0, err
            assert f"sent SIGHUP to pid {os.getpid()}" in out and "reload: changed: a" in out
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{load(path).server.port}") as client:
                r = await client.get("/admin/models")
                assert r.json()["config_error"] is None
            os.kill(os.getpid(), signal.SIGTERM)  # the server's own shutdown path
        assert not pid_path.exists()

    # The server gone and its port closed: --reload falls back to the pid file, which
    # names no live server now; the edit stands, the reload is reported as not done.
    rc, out, err = await corral(capsys, "config", "set", "--config", str(path), "models.a.n_ctx", "2048", "--reload")
    assert rc == 3 and "cannot connect" not in out and "corral.pid: no such file" in err


async def test_a_server_reloading_while_config_set_rewrites_never_sees_a_half_written_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # reload_settle 0: the server applies whatever it reads at once, so only the atomic
    # write stands between it and a half-written file.
    path = write_config(tmp_path / "corral.toml", {"a": {}, "b": {}}, {"port": free_port()}, reload_settle=0.0)
    # Padding, so that a write is more than one syscall's worth of a torn read.
    path.write_text(path.read_text() + "".join(f"# padding line {i} {'x' * 80}\n" for i in range(300)))
    port = load(path).server.port
    edits = 25
    last = 0
    problems: list[str] = []
    stop = trio.Event()

    async def hammer_http(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            r = await client.post("/admin/reload")
            if r.status_code != 200:
                problems.append(f"POST /admin/reload: {r.status_code} {r.text}")
            r = await client.get("/admin/models")
            if r.json()["config_error"] is not None:
                problems.append(f"config_error: {r.json()['config_error']}")

    async def hammer_sighup() -> None:
        while not stop.is_set():
            os.kill(os.getpid(), signal.SIGHUP)
            await trio.sleep(0.005)

    def read_in_a_loop() -> None:
        while not stop.is_set():
            try:
                load(path)
            except ConfigError as exc:
                problems.append(f"read: {exc}")

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve, load(path), worker_command=WORKER_COMMAND))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                nursery.start_soon(hammer_http, client)
                nursery.start_soon(hammer_sighup)
                nursery.start_soon(partial(trio.to_thread.run_sync, read_in_a_loop, abandon_on_cancel=True))
                for i in range(edits):
                    last = i % 8 + 1
                    rc, _, err = await corral(capsys, "config", "set", "--config", str(path), "models.a.slots", str(last))
                    assert rc == 0, err
                stop.set()
                r = await client.post("/admin/reload")
                assert r.status_code == 200
                r = await client.get("/admin/models")
                body = r.json()
            nursery.cancel_scope.cancel()
    assert problems == []
    assert body["config_error"] is None
    assert {m["name"]: m["slots"] for m in body["models"]}["a"] == last
