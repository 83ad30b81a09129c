"""`corral status|load|unload|reset|reload` run as a subprocess against a real server
(router and supervisor in this process, fake workers), exit codes included."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import pytest
import trio

from supervisor.config import load
from supervisor.supervisor import Supervisor
from tests.harness import write_config
from tests.process.support import WORKER_COMMAND, StartLog, corral, err, out, serving_http
from tests.secrets import secret

ADMIN = secret("cli-admin")


def _supervisor(path: Path) -> Supervisor:
    return Supervisor(load(path), worker_command=WORKER_COMMAND)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_status_table_and_json_load_and_unload(tmp_path: Path, start_log: StartLog) -> None:
    path = write_config(tmp_path / "corral.toml", {"chat": {"aliases": ["c"], "slots": 3}, "idle": {}})
    with trio.fail_after(60):
        async with serving_http(_supervisor(path)) as url:
            done = await corral("load", "c", "--url", url, cwd=tmp_path)  # by alias
            assert done.returncode == 0, err(done)
            assert out(done).startswith("chat: ready (pid ")

            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                for _ in range(2):
                    r = await client.post("/v1/completions", json={"model": "chat", "prompt": "x", "max_tokens": 2})
                    assert r.status_code == 200

            done = await corral("status", "--json", "--url", url, cwd=tmp_path)
            assert done.returncode == 0, err(done)
            raw = json.loads(out(done))
            assert set(raw) == {"models", "load_queue", "config_error", "needs_restart", "upstreams", "adapter_models"}
            models = {m["name"]: m for m in raw["models"]}
            assert models["chat"]["state"] == "ready" and models["chat"]["requests_per_minute"] == 2
            assert models["idle"]["state"] == "stopped" and models["idle"]["requests_per_minute"] == 0
            pid = models["chat"]["pid"]

            done = await corral("status", "--url", url, cwd=tmp_path)
            assert done.returncode == 0, err(done)
            header, *rows = out(done).splitlines()
            assert header.split() == ["MODEL", "STATE", "PID", "MEM", "SLOTS", "QUEUED", "RPM", "LAST", "USED", "LAST", "ERROR"]
            chat = next(r for r in rows if r.startswith("chat "))
            assert chat.split()[:3] == ["chat", "ready", str(pid)] and " 0/3 " in chat and "s ago" in chat
            idle = next(r for r in rows if r.startswith("idle "))
            assert idle.split()[1:3] == ["stopped", "-"] and "never" in idle

            done = await corral("status", "--url", url, cwd=tmp_path, COLUMNS="40")
            assert done.returncode == 0 and all(len(line) <= 40 for line in out(done).splitlines())
            assert out(done).splitlines()[0].split() == ["MODEL", "STATE", "SLOTS", "LAST", "ERROR"]

            done = await corral("unload", "chat", "--url", url, cwd=tmp_path)
            assert done.returncode == 0, err(done)
            assert out(done).strip() == "chat: stopped"  # it waited for the worker to stop
            assert start_log.pids("chat") == [pid]


async def test_a_failed_load_then_reset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start_log: StartLog) -> None:
    monkeypatch.setenv("FAKE_FAIL_LOAD", "bad magic " + "where the file's header should be " * 6)
    path = write_config(tmp_path / "corral.toml", {"chat": {}}, start_retries=0)
    with trio.fail_after(60):
        async with serving_http(_supervisor(path)) as url:
            done = await corral("load", "chat", "--url", url, cwd=tmp_path)
            assert done.returncode == 1 and "bad magic" in err(done) and out(done) == ""

            done = await corral("status", "--url", url, cwd=tmp_path)
            row = next(r for r in out(done).splitlines() if r.startswith("chat "))
            assert row.split()[1] == "failed" and "bad magic" in row
            # Piped with no $COLUMNS, a row is whole however long its error.
            done = await corral("status", "--url", url, cwd=tmp_path, COLUMNS="")
            row = next(r for r in out(done).splitlines() if r.startswith("chat "))
            error = json.loads(out(await corral("status", "--json", "--url", url, cwd=tmp_path)))["models"][0]["last_error"]
            assert len(error) > 100 and row.endswith(" ".join(error.split()))

            monkeypatch.delenv("FAKE_FAIL_LOAD")  # the server's workers inherit this process's
            done = await corral("reset", "chat", "--url", url, cwd=tmp_path)
            assert done.returncode == 0, err(done)
            assert out(done).strip() == "chat: stopped: reset; it loads again on its next request"
            done = await corral("reset", "chat", "--url", url, cwd=tmp_path)
            assert done.returncode == 0 and "was not failed; nothing to reset" in out(done)
            done = await corral("load", "chat", "--url", url, cwd=tmp_path)
            assert done.returncode == 0 and out(done).startswith("chat: ready"), err(done)
            await corral("unload", "chat", "--force", "--url", url, cwd=tmp_path)


async def test_reload_prints_the_diff_or_every_problem(tmp_path: Path, start_log: StartLog) -> None:
    path = write_config(tmp_path / "corral.toml", {"a": {}, "b": {}, "c": {}}, reload_settle=0.05)
    with trio.fail_after(60):
        async with serving_http(_supervisor(path)) as url:
            write_config(path, {"a": {"slots": 2}, "b": {}, "d": {}}, {"port": 1}, reload_settle=0.05)
            done = await corral("reload", "--url", url, cwd=tmp_path)
            assert done.returncode == 0, err(done)
            assert out(done).splitlines() == [
                "added: d", "removed: c", "changed: a", "needs restart: server.port", "unchanged: b",
            ]
            done = await corral("status", "--url", url, cwd=tmp_path)
            assert "needs restart to take effect: server.port" in out(done).splitlines()[0]

            path.write_text(path.read_text() + '[models.e]\npath = "nowhere.gguf"\nslots = 0\n')
            done = await corral("reload", "--url", url, cwd=tmp_path)
            assert done.returncode == 1 and out(done) == ""
            *problems, last = err(done).splitlines()
            assert problems == [
                "models.e.slots: must be 1..256, got 0", f"models.e.path: no such file: {tmp_path / 'nowhere.gguf'}",
            ]
            assert last == "corral reload: the new config is invalid; the server runs on with its old one"

            # A missing file alone does not refuse the file: the rest applies, and it says so.
            path.write_text(path.read_text().replace("slots = 0\n", ""))
            done = await corral("reload", "--url", url, cwd=tmp_path)
            assert done.returncode == 0, err(done)
            assert out(done).splitlines() == [
                "added: e", "needs restart: server.port", "unchanged: a, b, d", f"cannot load: models.e.path: no such file: {tmp_path / 'nowhere.gguf'}",
            ]


async def test_exit_codes_for_keys_unknown_models_and_no_server(tmp_path: Path, start_log: StartLog) -> None:
    api = secret("cli-api")
    path = write_config(tmp_path / "corral.toml", {"chat": {}}, {"admin_keys": [ADMIN], "api_keys": [api]})
    good, empty, wrong = tmp_path / "admin.key", tmp_path / "empty.key", tmp_path / "wrong.key"
    good.write_text(ADMIN + "\n")
    empty.write_text("\n")
    wrong.write_text(secret("not-this-one"))
    with trio.fail_after(60):
        async with serving_http(_supervisor(path)) as url:
            done = await corral("status", "--url", url, cwd=tmp_path)
            assert done.returncode == 4 and "didn't provide an API key" in err(done)
            done = await corral("status", "--url", url, "--admin-key-file", str(wrong), cwd=tmp_path)
            assert done.returncode == 4 and "Incorrect API key" in err(done)
            done = await corral("status", "--url", url, cwd=tmp_path, CORRAL_ADMIN_KEY=api)
            assert done.returncode == 4 and "not an admin key" in err(done)
            done = await corral("status", "--url", url, "--admin-key-file", str(empty), cwd=tmp_path)
            assert done.returncode == 2 and "is empty" in err(done)
            done = await corral("status", "--url", url, "--admin-key-file", str(tmp_path / "none"), cwd=tmp_path)
            assert done.returncode == 2 and "cannot read" in err(done)

            done = await corral("status", "--url", url, "--admin-key-file", str(good), cwd=tmp_path)
            assert done.returncode == 0 and out(done).startswith("MODEL"), err(done)
            for command in (["load", "nope"], ["unload", "nope"], ["reset", "nope"]):
                done = await corral(*command, "--url", url, cwd=tmp_path, CORRAL_ADMIN_KEY=ADMIN)
                assert done.returncode == 5 and "`nope` does not exist" in err(done), command

    # Nobody listens there now.
    done = await corral("status", "--url", url, cwd=tmp_path, CORRAL_ADMIN_KEY=ADMIN)
    assert done.returncode == 3 and "cannot reach" in err(done)
    done = await corral("status", "--url", "localhost:8080", cwd=tmp_path)
    assert done.returncode == 2 and "not an http:// or https:// URL" in err(done)
    done = await corral("load", cwd=tmp_path)
    assert done.returncode == 2 and "required: name" in err(done)
    for bad in ("0", "-1", "nan", "inf", "soon"):
        done = await corral("status", "--url", url, "--timeout", bad, cwd=tmp_path)
        assert done.returncode == 2 and "--timeout: must be a positive number of seconds" in err(done), bad


async def test_the_server_is_found_from_the_config(tmp_path: Path, start_log: StartLog) -> None:
    port = _free_port()
    path = write_config(tmp_path / "elsewhere.toml", {"chat": {}}, {"host": "127.0.0.1", "port": port})
    with trio.fail_after(60):
        async with serving_http(_supervisor(path), bind=[f"127.0.0.1:{port}"]):
            done = await corral("status", "--json", "--config", str(path), cwd=tmp_path)
            assert done.returncode == 0 and json.loads(out(done))["models"][0]["name"] == "chat", err(done)
            done = await corral("status", "--json", cwd=tmp_path, CORRAL_CONFIG=str(path))
            assert done.returncode == 0, err(done)
            assert err(done) == f"corral: http://127.0.0.1:{port}, from {path} ($CORRAL_CONFIG)\n"
            done = await corral("status", "--json", cwd=tmp_path, CORRAL_URL=f"http://127.0.0.1:{port}/")
            assert done.returncode == 0, err(done)
            # --url beats the environment; a config that cannot be read is a usage error.
            done = await corral("status", "--url", f"http://127.0.0.1:{port}", cwd=tmp_path, CORRAL_URL="http://127.0.0.1:1")
            assert done.returncode == 0, err(done)
            (tmp_path / "broken.toml").write_text("[server\n")
            done = await corral("status", "--config", str(tmp_path / "broken.toml"), cwd=tmp_path)
            assert done.returncode == 2 and "give --url" in err(done)


async def test_status_of_several_servers_is_one_table_and_names_the_one_that_is_down(
    tmp_path: Path, start_log: StartLog
) -> None:
    """`corral status --url A --url B` (issue 25, a fleet view): every server's models in one
    table with their host; a server that does not answer is a line of its own, and the exit
    code is 3 (unreachable) while the others are still shown. Other commands take one URL."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    key = tmp_path / "admin.key"
    key.write_text(ADMIN)
    first = write_config(tmp_path / "a" / "corral.toml", {"chat": {"slots": 2}}, {"admin_keys": [ADMIN]})
    second = write_config(tmp_path / "b" / "corral.toml", {"chat": {"slots": 3}, "embed": {}}, {"admin_keys": [ADMIN]})
    dead = f"http://127.0.0.1:{_free_port()}"
    with trio.fail_after(60):
        async with serving_http(_supervisor(first)) as a, serving_http(_supervisor(second)) as b:
            assert (await corral("load", "chat", "--url", b, "--admin-key-file", str(key), cwd=tmp_path)).returncode == 0
            done = await corral("status", "--url", a, "--url", b, "--admin-key-file", str(key), cwd=tmp_path)
            assert done.returncode == 0, err(done)
            header, *rows = out(done).splitlines()
            assert header.split()[:3] == ["HOST", "MODEL", "STATE"]
            host_a, host_b = a.split("://")[1], b.split("://")[1]
            assert sorted(r.split()[:3] for r in rows) == sorted(
                [[host_a, "chat", "stopped"], [host_b, "chat", "ready"], [host_b, "embed", "stopped"]]
            )

            done = await corral("status", "--json", "--url", a, "--url", dead, "--url", b, "--admin-key-file", str(key),
                                cwd=tmp_path)
            assert done.returncode == 3, err(done)
            hosts = json.loads(out(done))["hosts"]
            assert [h["url"] for h in hosts] == [a, dead, b]
            assert "cannot reach" in hosts[1]["error"] and [m["name"] for m in hosts[2]["models"]] == ["chat", "embed"]

            done = await corral("status", "--url", dead, "--url", a, "--admin-key-file", str(key), cwd=tmp_path)
            assert done.returncode == 3
            lines = out(done).splitlines()
            assert lines[0].startswith(dead.split("://")[1] + ": cannot reach")
            assert any(line.split()[:3] == [host_a, "chat", "stopped"] for line in lines)
            # A wrong key on every server: refused (4), each host says so.
            done = await corral("status", "--url", a, "--url", b, cwd=tmp_path, CORRAL_ADMIN_KEY=secret("not-this-one"))
            assert done.returncode == 4 and out(done).count("Incorrect API key") == 2

            done = await corral("load", "chat", "--url", a, "--url", b, "--admin-key-file", str(key), cwd=tmp_path)
            assert done.returncode == 2 and "only `corral status` takes several" in err(done)
