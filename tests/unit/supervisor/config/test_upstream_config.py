"""supervisor/config/upstreams.py: a [models.NAME] table that names an `upstream` (issue
25, item 1), as LiteLLM's model_list entries (api_base, api_key via os.environ/...,
timeout, max_parallel_requests) and llama-swap's peers (proxy, apiKey) lead users to
write it."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import parse
from supervisor.config.show import effective
from tests.unit.supervisor.config.test_config_problems import _problems as problems_of
from tests.unit.supervisor.config.test_config_problems import base


# A folder with a model "m.gguf" (`base`), and the problems a config text has there.
__all__ = ["base"]


def test_an_upstream_model_needs_no_path_and_runs_no_worker(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACK_KEY", " sk-back \n")
    cfg = parse(
        '[models.local]\npath = "m.gguf"\n'
        '[models.far]\nupstream = ["http://a:8080/v1/", "https://b.example/v1"]\nupstream_model = "qwen"\n'
        'api_key_env = "BACK_KEY"\ntimeout = 30\nmax_concurrency = 4\naliases = ["f"]\n'
        'upstream_dialects = ["openai", "anthropic"]\n',
        base,
    )
    assert list(cfg.models) == ["local"]  # the supervisor starts no worker for `far`
    far = cfg.upstreams["far"]
    assert far.urls == ("http://a:8080/v1", "https://b.example/v1")  # trailing slash dropped
    assert (far.model, far.api_key, far.timeout, far.max_concurrency) == ("qwen", "sk-back", 30.0, 4)
    assert far.dialects == {"openai", "anthropic"} and not far.local
    assert cfg.upstream("f") is far and cfg.upstream("far") is far and cfg.upstream("local") is None
    assert "sk-back" not in repr(far)  # a log line or a traceback never shows the key


def test_defaults_name_the_model_as_the_table_does_and_speak_openai(base: Path) -> None:
    far = parse('[models.far]\nupstream = "http://10.0.0.2:8080/v1"\n', base).upstreams["far"]
    assert (far.model, far.api_key, far.timeout, far.max_concurrency) == ("far", None, 600.0, None)
    assert far.dialects == {"openai"}


def test_path_and_upstream_make_the_local_worker_one_replica(base: Path) -> None:
    cfg = parse('[models.both]\npath = "m.gguf"\nupstream = "http://other:8080/v1"\nslots = 2\n', base)
    assert cfg.models["both"].slots == 2 and cfg.upstreams["both"].local


def test_the_key_file_is_read_relative_to_the_config(base: Path) -> None:
    (base / "key.txt").write_text("sk-file\n")
    far = parse('[models.far]\nupstream = "http://h/v1"\napi_key_file = "key.txt"\n', base).upstreams["far"]
    assert far.api_key == "sk-file" and far.api_key_file == "key.txt"
    shown = effective(parse('[models.far]\nupstream = "http://h/v1"\napi_key_file = "key.txt"\n', base))
    assert shown["models"]["far"]["upstream"] == ["http://h/v1"] and "sk-file" not in repr(shown)


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('upstream = "ftp://h/v1"', "models.far.upstream: 'ftp://h/v1' is not an http:// or https:// URL"),
        ('upstream = "http:///v1"', "models.far.upstream: 'http:///v1' names no host"),
        ('upstream = "http://h:99999/v1"', "models.far.upstream: 'http://h:99999/v1' has a port that is not a number in 1..65535"),
        ('upstream = "http://u:p@h/v1"', "models.far.upstream: 'http://u:p@h/v1': give the base URL only (\"http://host:8080/v1\"), with no query, fragment or credentials"),
        ('upstream = []', "models.far.upstream: give at least one URL"),
        ('upstream = ["http://h/v1", "http://h/v1/"]', "models.far.upstream[1]: 'http://h/v1/' is listed twice"),
        ('upstream = "http://h/v1"\nslots = 2', "models.far.slots: applies to a model served here (with `path`); this one is served by its `upstream`, which has its own settings"),
        ('upstream = "http://h/v1"\ntemperature = 0.2', "models.far.temperature: applies to a model served here (with `path`); this one is served by its `upstream`, which has its own settings"),
        ('upstream = "http://h/v1"\ntimeout = 0', "models.far.timeout: must be above 0 and at most 86400 seconds (a day), got 0.0"),
        ('upstream = "http://h/v1"\ntimeout = 1e300', "models.far.timeout: must be above 0 and at most 86400 seconds (a day), got 1e+300"),
        ('upstream = " http://h/v1"', "models.far.upstream: ' http://h/v1' has spaces or control characters"),
        ('upstream = "http://h/my models/v1"', "models.far.upstream: 'http://h/my models/v1' has spaces or control characters"),
        ('upstream = "http://h:0/v1"', "models.far.upstream: 'http://h:0/v1' has a port that is not a number in 1..65535"),
        ('upstream = "http://h/v1/chat/completions"', "models.far.upstream: 'http://h/v1/chat/completions' names a route: give the base URL the routes are under (\"http://host:8080/v1\")"),
        ('upstream = "http://h/v1"\napi_key_env = "CORRAL_TEST_ODD_KEY"', "models.far.api_key_env: the key in CORRAL_TEST_ODD_KEY has characters a header cannot carry (spaces, control characters or non-ASCII)"),
        ('upstream = "http://h/v1"\nmax_concurrency = 0', "models.far.max_concurrency: must be at least 1, got 0"),
        ('upstream = "http://h/v1"\nupstream_dialects = ["openai", "grpc"]', "models.far.upstream_dialects[1]: 'grpc' is not one of openai, anthropic, responses, ollama, llama"),
        ('upstream = "http://h/v1"\nupstream_dialects = []', "models.far.upstream_dialects: give at least one of openai, anthropic, responses, ollama, llama"),
        ('upstream = "http://h/v1"\nupstream_model = " "', "models.far.upstream_model: must not be empty"),
        ('upstream = "http://h/v1"\napi_key_env = "CORRAL_TEST_UNSET_KEY"', "models.far.api_key_env: the environment variable CORRAL_TEST_UNSET_KEY is not set"),
        ('upstream = "http://h/v1"\napi_key_env = "A"\napi_key_file = "k"', "models.far.api_key_file: set api_key_env or api_key_file, not both"),
        ('path = "m.gguf"\ntimeout = 5', "models.far.timeout: only applies to a model with `upstream` (a model served elsewhere)"),
        ('path = "m.gguf"\nupstream_model = "x"', "models.far.upstream_model: only applies to a model with `upstream` (a model served elsewhere)"),
    ],
)
def test_each_mistake_is_named_by_its_key(base: Path, table: str, problem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_ODD_KEY", "sk café")
    assert problems_of(f"[models.far]\n{table}\n", base) == [problem]


def test_a_key_file_saved_with_a_bom_gives_the_key_and_a_non_ascii_one_is_refused(base: Path) -> None:
    (base / "bom.key").write_bytes(b"\xef\xbb\xbfsk-bom\n")
    assert parse('[models.far]\nupstream = "http://h/v1"\napi_key_file = "bom.key"\n', base).upstreams["far"].api_key == "sk-bom"
    (base / "odd.key").write_text("sk-caf\u00e9\n", encoding="utf-8")
    assert problems_of('[models.far]\nupstream = "http://h/v1"\napi_key_file = "odd.key"\n', base) == [
        f"models.far.api_key_file: the key in {base / 'odd.key'} has characters a header cannot carry "
        "(spaces, control characters or non-ASCII)"
    ]


def test_a_missing_key_file_is_named_with_its_path(base: Path) -> None:
    (problem,) = problems_of('[models.far]\nupstream = "http://h/v1"\napi_key_file = "nope.txt"\n', base)
    assert problem == f"models.far.api_key_file: cannot read {base / 'nope.txt'}: No such file or directory"


def test_model_defaults_give_each_kind_of_table_only_its_own_keys(base: Path) -> None:
    cfg = parse(
        '[model_defaults]\nslots = 2\ntimeout = 20\n'
        '[models.here]\npath = "m.gguf"\n[models.far]\nupstream = "http://h/v1"\n'
        '[models.both]\npath = "m.gguf"\nupstream = "http://h/v1"\naliases = ["b"]\n',
        base,
    )
    assert cfg.models["here"].slots == 2 and "here" not in cfg.upstreams
    assert cfg.upstreams["far"].timeout == 20.0 and "far" not in cfg.models
    assert cfg.models["both"].slots == 2 and cfg.upstreams["both"].timeout == 20.0
    assert problems_of('[model_defaults]\nupstream = "http://h/v1"\n[models.a]\npath = "m.gguf"\n', base) == [
        "model_defaults.upstream: set per model, not for all"
    ]


def test_the_fleet_names_servers_by_their_root_and_reads_one_key(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_KEY", "adm-1")
    cfg = parse('[server]\nfleet = ["http://10.0.0.2:8080", "https://b.example"]\nfleet_key_env = "FLEET_KEY"\n'
                '[models.m]\npath = "m.gguf"\n', base)
    assert cfg.server.fleet == ["http://10.0.0.2:8080", "https://b.example"] and cfg.fleet_key == "adm-1"
    monkeypatch.delenv("FLEET_KEY")
    assert problems_of('[server]\nfleet = ["http://10.0.0.2:8080/v1", "ftp://x", "http://a b"]\n'
                       'fleet_key_env = "FLEET_KEY"\n[models.m]\npath = "m.gguf"\n', base) == [
        "server.fleet[0]: 'http://10.0.0.2:8080/v1': give the server's root URL (\"http://host:8080\"), with no path",
        "server.fleet[1]: 'ftp://x' is not an http:// or https:// URL",
        "server.fleet[2]: 'http://a b' has spaces or control characters",
        "server.fleet_key_env: the environment variable FLEET_KEY is not set",
    ]
    assert problems_of('[server]\nfleet_key_env = "A"\nfleet_key_file = "k"\n[models.m]\npath = "m.gguf"\n', base) == [
        "server.fleet_key_file: set fleet_key_env or fleet_key_file, not both"
    ]
