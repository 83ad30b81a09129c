"""`corral config set/unset/add-model/remove-model/show` on real files: a refused edit
leaves the file's bytes and mtime alone, a written one keeps the file's mode and its
symlink, and the commands find the file by the search path as `serve` does."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

import pytest

from corral.main import main
from supervisor import pid_file
from tests.harness import write_gguf
from tests.secrets import secret
from tests.unit.supervisor.config.test_config_edit import RICH, assert_only_table_changed

OLD = 1_600_000_000  # an mtime that no write of this test's could give


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """RICH as a file, its models' GGUFs beside it, with an old mtime."""
    for name in ("qwen.gguf", "qwen25.gguf", "embed.gguf", "new.gguf"):
        write_gguf(tmp_path / name)
    path = tmp_path / "corral.toml"
    path.write_text(RICH)
    os.utime(path, (OLD, OLD))
    for env in ("CORRAL_CONFIG", "CORRAL_URL", "CORRAL_ADMIN_KEY", "CORRAL_API_KEYS"):
        monkeypatch.delenv(env, raising=False)
    return path


def corral(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["set", "models.qwen.slots", "0"], "models.qwen.slots: must be 1..256, got 0"),
        (["set", "models.qwen.slot", "2"], "models.qwen.slot: unknown key; did you mean models.qwen.slots?"),
        (["set", "server.port", "http"], "server.port: expected int, got 'http'"),
        (["set", "models.embed.pooling", "max"], "models.embed.pooling: "),
        (["set", "server.default_model", "nope"], "server.default_model: 'nope' is neither a model nor an alias"),
        (["set", "models.embed.aliases", "q"], "models.embed.aliases[0]: 'q' is already used by models.qwen.aliases"),
        (["unset", "models.qwen.path"], "models.qwen.path: required, cannot be unset"),
        (["add-model", "qwen", "new.gguf"], "models.qwen: already exists"),
        (["add-model", "other", "missing.gguf"], "models.other.path: no such file"),
        (["add-model", "other", "new.gguf", "--slots", "lots"], "models.other.slots: expected int, got 'lots'"),
        (["remove-model", "qwne"], "models.qwne: no such model"),
    ],
)
def test_a_refused_edit_names_the_key_and_leaves_bytes_and_mtime_alone(
    cfg: Path, capsys: pytest.CaptureFixture[str], args: list[str], problem: str
) -> None:
    rc, out, err = corral(capsys, "config", *args[:1], "--config", str(cfg), *args[1:])
    assert rc == 1
    assert problem in err and "refused, not changed" in err, err
    assert cfg.read_bytes() == RICH.encode() and cfg.stat().st_mtime == OLD
    assert [p.name for p in cfg.parent.iterdir() if p.name.startswith(".corral.toml")] == []  # no temp file left


def test_with_one_model_file_gone_other_edits_still_work_but_no_new_broken_path(
    cfg: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad download fails its model alone (issue 20): `config set` of anything else must
    not be refused for it, while an edit that points a model at a missing file still is."""
    (cfg.parent / "embed.gguf").unlink()
    rc, _, err = corral(capsys, "config", "set", "--config", str(cfg), "models.qwen.slots", "3")
    assert rc == 0, err
    assert tomllib.loads(cfg.read_text())["models"]["qwen"]["slots"] == 3
    rc, _, err = corral(capsys, "config", "set", "--config", str(cfg), "models.qwen.path", "gone.gguf")
    assert rc == 1 and "models.qwen.path: no such file" in err and "models.embed" not in err, err
    rc, _, err = corral(capsys, "config", "check", str(cfg))
    assert rc == 1 and "models.embed.path: no such file" in err


def test_removing_the_last_model_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_gguf(tmp_path / "a.gguf")
    path = tmp_path / "c.toml"
    path.write_text('[models.a]\npath = "a.gguf"\n')
    rc, _, err = corral(capsys, "config", "remove-model", "--config", str(path), "a")
    assert rc == 1 and "models: at least one [models.NAME] table is required" in err
    assert path.read_text() == '[models.a]\npath = "a.gguf"\n'


def test_every_edit_round_trips_keeping_the_bytes_outside_its_table(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = corral(capsys, "config", "set", "--config", str(cfg), 'models."qwen2.5".slots', "6")
    assert rc == 0 and "+slots = 6" in out
    after_set = cfg.read_text()
    assert_only_table_changed(RICH, after_set, '[models."qwen2.5"]')
    assert cfg.stat().st_mtime != OLD

    rc, _, _ = corral(capsys, "config", "unset", "--config", str(cfg), 'models."qwen2.5".slots')
    assert rc == 0 and cfg.read_text() == RICH  # set then unset: the very same bytes

    rc, out, _ = corral(capsys, "config", "unset", "--config", str(cfg), "server.tls_cert")
    assert rc == 0 and "not set in the file" in out and cfg.read_text() == RICH

    rc, _, _ = corral(capsys, "config", "add-model", "--config", str(cfg), "new", str(cfg.parent / "new.gguf"), "--alias", "n", "--slots", "2")
    added = cfg.read_text()
    assert rc == 0 and added.startswith(RICH)
    # An absolute path under the config's folder is written relative to it, as the file reads paths.
    assert tomllib.loads(added)["models"]["new"] == {"path": "new.gguf", "slots": 2, "aliases": ["n"]}

    rc, _, _ = corral(capsys, "config", "remove-model", "--config", str(cfg), "new")
    assert rc == 0 and cfg.read_text() == RICH


def test_a_relative_model_path_is_written_from_the_config_folder(
    cfg: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = cfg.parent / "models"
    sub.mkdir()
    write_gguf(sub / "m.gguf")
    monkeypatch.chdir(sub)  # the operator stands in models/ and names m.gguf
    rc, _, err = corral(capsys, "config", "add-model", "--config", str(cfg), "m", "m.gguf")
    assert rc == 0, err
    assert tomllib.loads(cfg.read_text())["models"]["m"]["path"] == "models/m.gguf"


def test_add_model_takes_every_option_and_a_template_file_from_here(
    cfg: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = cfg.parent / "t"
    sub.mkdir()
    (sub / "chat.jinja").write_text("{{ messages }}")
    monkeypatch.chdir(sub)
    rc, _, err = corral(
        capsys, "config", "add-model", "--config", str(cfg), "m", "../new.gguf", "--n-ctx", "2048",
        "--chat-template", "chat.jinja", "--pinned", "-o", "max_queue=8", "-o", "reasoning=false",
    )
    assert rc == 0, err
    assert tomllib.loads(cfg.read_text())["models"]["m"] == {
        "path": "new.gguf", "n_ctx": 2048, "chat_template": "t/chat.jinja", "pinned": True,
        "max_queue": 8, "reasoning": False,
    }
    rc, _, err = corral(capsys, "config", "add-model", "--config", str(cfg), "m2", "../new.gguf", "-o", "nosuch=1")
    assert rc == 1 and "models.m2.nosuch: unknown key" in err


def test_the_write_keeps_mode_and_symlink(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg.chmod(0o600)
    link = cfg.parent / "link.toml"
    link.symlink_to(cfg.name)
    rc, _, _ = corral(capsys, "config", "set", "--config", str(link), "server.port", "9001")
    assert rc == 0
    assert link.is_symlink() and tomllib.loads(cfg.read_text())["server"]["port"] == 9001
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600


def test_a_read_only_file_is_not_replaced(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg.chmod(0o444)
    rc, _, err = corral(capsys, "config", "set", "--config", str(cfg), "server.port", "9001")
    assert rc == 1 and "is read-only" in err
    assert cfg.read_bytes() == RICH.encode() and cfg.stat().st_mtime == OLD


def test_without_config_the_search_path_is_used_and_named(
    cfg: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(cfg.parent)
    monkeypatch.setenv("HOME", str(cfg.parent / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(cfg.parent / "xdg"))
    rc, _, err = corral(capsys, "config", "set", "server.port", "9002")
    assert rc == 0 and "corral: using corral.toml (the first of the search path)" in err
    assert tomllib.loads(cfg.read_text())["server"]["port"] == 9002
    monkeypatch.setenv("CORRAL_CONFIG", str(cfg))
    rc, out, err = corral(capsys, "config", "show")
    assert rc == 0 and f"using {cfg} ($CORRAL_CONFIG)" in err and "port = 9002" in out


def test_secrets_never_reach_the_terminal(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    admin, api = secret("cli-admin"), secret("cli-api")
    rc, out, err = corral(capsys, "config", "set", "--config", str(cfg), "server.admin_keys", admin)
    assert rc == 0 and '+admin_keys = ["***"]' in out
    rc, out, err = corral(capsys, "config", "set", "--config", str(cfg), "server.api_keys", f'[{{"key": "{api}", "name": "ci"}}]')
    assert rc == 0 and 'name = "ci"' in out
    rc, out, err = corral(capsys, "config", "show", "--config", str(cfg))
    assert rc == 0 and '"***"' in out and 'name = "ci"' in out
    rc, out, err = corral(capsys, "config", "show", "--json", "--config", str(cfg))
    assert rc == 0 and '"admin_keys": [\n      "***"\n    ]' in out
    assert admin in cfg.read_text() and api in cfg.read_text()  # written, only never shown
    # (tests/conftest.py fails this test if either key reached the captured output)


def test_a_second_server_does_not_take_a_live_servers_pid_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "corral.pid"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        path.write_text(f"{other.pid}\n")  # written after it started: a live server's file
        with pytest.raises(FileExistsError, match=f"process {other.pid} is running"):
            with pid_file.held(str(path)):
                pass
        assert path.read_text() == f"{other.pid}\n"
    finally:
        other.kill()
        other.wait()
    with pid_file.held(str(path)):  # now stale: taken over
        assert path.read_text() == f"{os.getpid()}\n"
    assert not path.exists()


def test_a_stale_pid_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "corral.pid"
    pid_file.write(path)
    assert pid_file.read_live(path) == os.getpid()
    os.utime(path, (OLD, OLD))  # written long before this process started: someone else's
    with pytest.raises(pid_file.PidFileError, match="stale pid file"):
        pid_file.read_live(path)
    path.write_text("bogus\n")
    with pytest.raises(pid_file.PidFileError, match="holds no pid"):
        pid_file.read_live(path)


def test_two_edits_at_once_lose_neither(cfg: Path) -> None:
    """Each `config set` reads, edits and renames under a lock on the folder; without it,
    one edit would rename a file made from text the other had already replaced."""
    import threading

    def edit(key: str, values: list[str]) -> None:
        for v in values:
            assert main(["config", "set", "--config", str(cfg), key, v]) == 0

    ports = [str(9000 + i) for i in range(15)]
    slots = [str(i % 8 + 1) for i in range(15)]
    threads = [
        threading.Thread(target=edit, args=("server.port", ports)),
        threading.Thread(target=edit, args=("models.qwen.slots", slots)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = tomllib.loads(cfg.read_text())
    assert final["server"]["port"] == int(ports[-1]) and final["models"]["qwen"]["slots"] == int(slots[-1])
