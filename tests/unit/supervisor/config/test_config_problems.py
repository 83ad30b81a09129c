"""A config check reports every problem at once, in English, with suggestions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config import parse
from supervisor.config.convert import parse_duration
from tests.harness import config_problems as _problems
from tests.harness import write_gguf
from supervisor.config.upstreams import MISSING_PATH

SEVEN_MISTAKES = """\
[server]
prot = 8080
port = 70000
log_format = "xml"

[supervisor]
idle_timeout = "ten minutes"

[models.a]
path = "a.gguf"
slots = "ten"

[models.b]
path = "notes.gguf"

[model.c]
path = "a.gguf"
"""


def test_seven_mistakes_of_seven_kinds_give_seven_lines_from_one_check(tmp_path: Path) -> None:
    write_gguf(tmp_path / "a.gguf")
    (tmp_path / "notes.gguf").write_text("a text file, not a model\n")
    config = tmp_path / "config.toml"
    config.write_text(SEVEN_MISTAKES)
    done = subprocess.run(
        [sys.executable, "-m", "corral", "config", "check", str(config)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert sorted(lines) == sorted(f"{config}: {p}" for p in [
        "server.prot: unknown key (did you mean port?)",
        "[model.c]: unknown table (did you mean [models.c]?)",
        'models.a.slots: expected an integer, got "ten"',
        'supervisor.idle_timeout: expected a number of seconds or a duration such as "10m", got "ten minutes"',
        'server.log_format: expected one of "text", "json", got "xml"',
        "server.port: must be 0..65535, got 70000",
        f"models.b.path: {tmp_path / 'notes.gguf'}: not a GGUF model file (no GGUF magic)",
    ]), done.stderr


@pytest.fixture
def base(tmp_path: Path) -> Path:
    write_gguf(tmp_path / "m.gguf")
    return tmp_path


MINIMAL = '[models.a]\npath = "m.gguf"\n'


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[sever]\nport = 1\n" + MINIMAL, "[sever]: unknown table (did you mean [server]?)"),
        ("[supervisr]\n" + MINIMAL, "[supervisr]: unknown table (did you mean [supervisor]?)"),
        ("[model.x]\npath = 'm.gguf'\n[model.y]\npath = 'm.gguf'\n" + MINIMAL, "[model.x]: unknown table (did you mean [models.x]?)"),
        ("colour = 1\n" + MINIMAL, "colour: unknown key"),
        (MINIMAL + "nctx = 4096\n", "models.a.nctx: unknown key (did you mean n_ctx?)"),
        ("[supervisor]\nidle_timout = 5\n" + MINIMAL, "supervisor.idle_timout: unknown key (did you mean idle_timeout?)"),
        (MINIMAL + "embeddings = 1\n", "models.a.embeddings: expected true or false, got 1"),
        (MINIMAL + "aliases = \"x\"\n", 'models.a.aliases: expected a list, got "x"'),
        (MINIMAL + "threads = 2.5\n", "models.a.threads: expected an integer, got 2.5"),
        (MINIMAL + "slots = [1]\n", "models.a.slots: expected an integer, got a list"),
        (MINIMAL + "queue_timeout = true\n", 'models.a.queue_timeout: expected a number of seconds or a duration such as "10m", got true'),
        ("[server]\napi_keys = [{ key = 'k', owner = 'x' }]\n" + MINIMAL, "server.api_keys[0].owner: unknown key"),
        ('[models."a.b"]\npath = 5\n', 'models."a.b".path: expected a string, got 5'),
        ('[server]\nhost = "a\\nb"\n' + MINIMAL, "server.host: 'a\\nb' is not an address or a host name"),
        ('[server]\nhost = ""\n' + MINIMAL, "server.host: '' is not an address or a host name"),
    ],
)
def test_one_problem_in_words(base: Path, text: str, problem: str) -> None:
    assert problem in _problems(text, base)


def test_the_misspelt_model_tables_are_each_named(base: Path) -> None:
    ps = _problems("[model.x]\npath = 'm.gguf'\n[model.y]\npath = 'm.gguf'\n" + MINIMAL, base)
    assert ps == [
        "[model.x]: unknown table (did you mean [models.x]?)",
        "[model.y]: unknown table (did you mean [models.y]?)",
    ]


def test_a_bad_value_does_not_hide_the_checks_of_the_rest(base: Path) -> None:
    """A type error in one key leaves the other keys' checks running: one pass finds all."""
    text = '[server]\nport = "x"\nmax_body_bytes = 10\n[models.a]\npath = "m.gguf"\nslots = "many"\nn_ctx = 4\n'
    assert _problems(text, base) == [
        'server.port: expected an integer, got "x"',
        'models.a.slots: expected an integer, got "many"',
        "server.max_body_bytes: must be at least 1024, got 10",
        "models.a.n_ctx: must be at least 16, got 4",
    ]


def test_a_model_missing_its_path_is_one_problem_not_two(base: Path) -> None:
    text = '[server]\ndefault_model = "b"\n[models.b]\nslots = 2\n'
    assert _problems(text, base) == [f"models.b.path: {MISSING_PATH}"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("10m", 600), ("1h", 3600), ("1h30m", 5400), ("1.5h", 5400), ("250ms", 0.25), ("2d", 172800), (" 5 m ", 300)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "ten minutes", "m", "5x", "-5m", "1h-2m"])
def test_not_durations(text: str) -> None:
    assert parse_duration(text) is None


def test_durations_in_the_file(base: Path) -> None:
    cfg = parse('[server]\ndrain_timeout = "1m"\n[supervisor]\nidle_timeout = "10m"\n' + MINIMAL + 'idle_timeout = "1h"\nqueue_timeout = "30s"\n', base)
    assert cfg.server.drain_timeout == 60 and cfg.supervisor.idle_timeout == 600
    assert cfg.models["a"].idle_timeout == 3600 and cfg.models["a"].queue_timeout == 30


def test_a_truncated_model_file_is_that_models_problem(base: Path) -> None:
    data = (base / "m.gguf").read_bytes()
    (base / "cut.gguf").write_bytes(data[:-3])
    assert parse('[models.a]\npath = "cut.gguf"\n', base).unloadable == {
        "a": f"models.a.path: {(base / 'cut.gguf').resolve()}: not a GGUF model file (truncated header)"
    }
