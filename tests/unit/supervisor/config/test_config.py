"""supervisor/config/: parsing, defaults, path resolution and `key.path: message` errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import Config, ConfigError, load, parse
from tests.harness import write_gguf
from worker.protocol import SamplingParams


@pytest.fixture
def base(tmp_path: Path) -> Path:
    write_gguf(tmp_path / "m.gguf")
    write_gguf(tmp_path / "other.gguf")
    return tmp_path


def problems(text: str, base_dir: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text, base_dir)
    assert info.value.problems, "ConfigError without problems"
    return info.value.problems


def one_problem(text: str, base_dir: Path) -> str:
    ps = problems(text, base_dir)
    assert len(ps) == 1, ps
    return ps[0]


MINIMAL = '[models.a]\npath = "m.gguf"\n'


# ---- valid configs ------------------------------------------------------------------------------


def test_minimal_config(base: Path) -> None:
    cfg = parse(MINIMAL, base)
    assert isinstance(cfg, Config)
    assert list(cfg.models) == ["a"]
    spec = cfg.models["a"]
    assert spec.name == "a"
    assert spec.path == (base / "m.gguf").resolve()
    assert spec.path.is_absolute()


def test_defaults(base: Path) -> None:
    cfg = parse(MINIMAL, base)
    spec = cfg.models["a"]
    assert spec.slots == 4
    assert spec.n_ctx == 4096
    assert spec.n_batch == 512
    assert spec.threads is None
    assert spec.n_gpu_layers == 0
    assert spec.chat_template is None
    assert spec.embeddings is False
    assert spec.pooling is None
    assert spec.aliases == ()
    assert spec.repack is False  # repacking segfaults on AMX CPUs (ggml-org/llama.cpp#20824)
    assert spec.swa_full is True
    assert spec.idle_timeout == cfg.supervisor.idle_timeout == 600.0
    assert cfg.server.host == "127.0.0.1"
    assert cfg.server.port == 8080
    assert cfg.supervisor.start_timeout == 120.0
    assert cfg.supervisor.stop_grace == 5.0


def test_idle_timeout_inherits_supervisor(base: Path) -> None:
    text = (
        "[supervisor]\nidle_timeout = 30\n"
        '[models.a]\npath = "m.gguf"\n'
        '[models.b]\npath = "m.gguf"\nidle_timeout = 0\n'
    )
    cfg = parse(text, base)
    assert cfg.models["a"].idle_timeout == 30.0
    assert cfg.models["b"].idle_timeout == 0.0


def test_full_config(base: Path) -> None:
    text = """
[server]
host = "0.0.0.0"
port = 9000
max_body_bytes = 2048

[supervisor]
idle_timeout = 10
start_timeout = 5.5
stop_grace = 1

[models.chat]
path = "m.gguf"
aliases = ["default", "gpt-4o"]
slots = 8
n_ctx = 8192
n_batch = 256
threads = 2
n_gpu_layers = -1
chat_template = "gemma"
repack = true
swa_full = false

[models.embed]
path = "other.gguf"
embeddings = true
pooling = "cls"
"""
    cfg = parse(text, base)
    assert cfg.server.host == "0.0.0.0" and cfg.server.port == 9000
    assert cfg.supervisor.start_timeout == 5.5
    chat = cfg.models["chat"]
    assert chat.aliases == ("default", "gpt-4o")
    assert (chat.slots, chat.n_ctx, chat.n_batch, chat.threads) == (8, 8192, 256, 2)
    assert chat.n_gpu_layers == -1
    assert chat.chat_template == "gemma"
    assert chat.repack is True and chat.swa_full is False
    assert chat.idle_timeout == 10.0
    embed = cfg.models["embed"]
    assert embed.embeddings is True and embed.pooling == "cls"
    assert embed.path == (base / "other.gguf").resolve()


def test_model_path_relative_to_config_folder(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "conf").mkdir()
    model = tmp_path / "models" / "x.gguf"
    write_gguf(model)
    cfg = parse('[models.x]\npath = "../models/x.gguf"\n', tmp_path / "conf")
    assert cfg.models["x"].path == model.resolve()


def test_absolute_model_path(tmp_path: Path, base: Path) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    cfg = parse(f'[models.a]\npath = "{(base / "m.gguf").as_posix()}"\n', other)
    assert cfg.models["a"].path == (base / "m.gguf").resolve()


def test_load_resolves_relative_to_file(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    write_gguf(tmp_path / "models" / "x.gguf")
    conf = tmp_path / "etc" / "corral.toml"
    conf.parent.mkdir()
    conf.write_text('[models.x]\npath = "../models/x.gguf"\n', encoding="utf-8")
    cfg = load(conf)
    assert cfg.source == conf.resolve()
    assert cfg.models["x"].path == (tmp_path / "models" / "x.gguf").resolve()


def test_load_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    """Pins 3fcb3d8: the UnicodeDecodeError escaped the loader, past the SIGHUP handler."""
    conf = tmp_path / "latin1.toml"
    conf.write_bytes('[models.caf\xe9]\n'.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load(conf)
    assert info.value.problems == ["(file): not UTF-8 text (byte 11)"]


def test_load_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load(missing)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith("(file): cannot read")
    assert info.value.source == str(missing)
    assert str(missing) in str(info.value)


def test_load_reports_source_in_errors(tmp_path: Path) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text("[models.a]\npath = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load(conf)
    assert info.value.source == str(conf)
    assert str(info.value).startswith(f"{conf}: ")


def test_example_config_is_valid(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[4] / "examples" / "config.toml"
    # Validate against a stand-in model file at the same relative place, so no GGUF is needed.
    (tmp_path / "models").mkdir()
    write_gguf(tmp_path / "models" / "gemma-3-270m-Q4_K_M.gguf")
    (tmp_path / "examples").mkdir()
    cfg = parse(example.read_text(encoding="utf-8"), tmp_path / "examples")
    assert cfg.resolve("gemma") is cfg.models["gemma-3-270m"]
    assert cfg.models["gemma-3-270m"].chat_template == "gemma"
    assert cfg.models["gemma-embed"].embeddings is True


# ---- resolve ------------------------------------------------------------------------------------


def test_resolve_by_name_and_alias(base: Path) -> None:
    text = (
        '[models.a]\npath = "m.gguf"\naliases = ["alpha", "first"]\n'
        '[models.b]\npath = "m.gguf"\naliases = ["beta"]\n'
    )
    cfg = parse(text, base)
    assert cfg.resolve("a") is cfg.models["a"]
    assert cfg.resolve("b") is cfg.models["b"]
    assert cfg.resolve("alpha") is cfg.models["a"]
    assert cfg.resolve("first") is cfg.models["a"]
    assert cfg.resolve("beta") is cfg.models["b"]
    assert cfg.resolve("gamma") is None
    assert cfg.resolve("") is None
    assert cfg.resolve("A") is None  # names are case-sensitive


# ---- errors -------------------------------------------------------------------------------------


def test_unknown_top_level_key(base: Path) -> None:
    assert one_problem("foo = 1\n" + MINIMAL, base) == "foo: unknown key"


def test_unknown_key_in_server(base: Path) -> None:
    assert one_problem("[server]\nfoo = 1\n" + MINIMAL, base) == "server.foo: unknown key"


def test_unknown_key_in_supervisor(base: Path) -> None:
    assert one_problem("[supervisor]\nbar = 1\n" + MINIMAL, base) == "supervisor.bar: unknown key"


def test_unknown_key_in_model(base: Path) -> None:
    assert one_problem(MINIMAL + "foo = 1\n", base) == "models.a.foo: unknown key"


def test_wrong_type_in_model(base: Path) -> None:
    """Pins fa77ad6: msgspec writes dict keys as `[...]` in its error paths, so a problem in
    a model's table did not name the model; each table is now converted on its own."""
    assert one_problem(MINIMAL + 'n_ctx = "big"\n', base) == 'models.a.n_ctx: expected an integer, got "big"'


def test_wrong_type_in_server(base: Path) -> None:
    assert (
        one_problem('[server]\nport = "80"\n' + MINIMAL, base)
        == 'server.port: expected an integer, got "80"'
    )


def test_wrong_type_in_alias_list_names_model(base: Path) -> None:
    msg = one_problem(MINIMAL + "aliases = [1]\n", base)
    assert msg.startswith("models.a.aliases")
    assert msg == "models.a.aliases[0]: expected a string, got 1"


def test_models_not_a_table(base: Path) -> None:
    assert one_problem("models = 3\n", base) == "models: expected tables [models.NAME], got 3"


def test_missing_path(base: Path) -> None:
    assert one_problem("[models.a]\nslots = 2\n", base) == (
        "models.a.path: required key is missing (or give `upstream`, the URL of a server that serves the model)"
    )


def test_nonexistent_model_file_is_that_models_problem_not_the_configs(base: Path) -> None:
    """One bad download must not stop the other models (issue 20): the config parses, and
    the model's problem is kept for `serve` to show it failed and `config check` to refuse."""
    cfg = parse('[models.a]\npath = "missing.gguf"\n[models.b]\npath = "m.gguf"\n', base)
    assert set(cfg.models) == {"a", "b"} and list(cfg.unloadable) == ["a"]
    msg = cfg.unloadable["a"]
    assert msg.startswith("models.a.path: no such file")
    assert str((base / "missing.gguf").resolve()) in msg


def test_model_path_is_a_directory(base: Path) -> None:
    (base / "dir.gguf").mkdir()
    assert parse('[models.a]\npath = "dir.gguf"\n', base).unloadable == {
        "a": f"models.a.path: {(base / 'dir.gguf').resolve()}: a folder, not a GGUF model file"
    }


def test_a_config_with_good_files_has_none_unloadable(base: Path) -> None:
    assert parse(MINIMAL, base).unloadable == {}


def test_duplicate_alias_across_models_names_both(base: Path) -> None:
    text = (
        '[models.a]\npath = "m.gguf"\naliases = ["shared"]\n'
        '[models.b]\npath = "m.gguf"\naliases = ["other", "shared"]\n'
    )
    msg = one_problem(text, base)
    assert msg.startswith("models.b.aliases[1]:")
    assert "'shared'" in msg
    assert "models.a" in msg


def test_alias_equal_to_another_models_name(base: Path) -> None:
    text = '[models.a]\npath = "m.gguf"\naliases = ["b"]\n[models.b]\npath = "m.gguf"\n'
    msg = one_problem(text, base)
    assert msg.startswith("models.a.aliases[0]:")
    assert "'b'" in msg and "models.b" in msg


def test_alias_equal_to_later_models_name_in_either_order(base: Path) -> None:
    text = '[models.b]\npath = "m.gguf"\n[models.a]\npath = "m.gguf"\naliases = ["b"]\n'
    msg = one_problem(text, base)
    assert msg.startswith("models.a.aliases[0]:") and "models.b" in msg


def test_duplicate_alias_within_one_model(base: Path) -> None:
    msg = one_problem(MINIMAL + 'aliases = ["x", "x"]\n', base)
    assert msg.startswith("models.a.aliases[1]:")


def test_empty_alias(base: Path) -> None:
    assert (
        one_problem(MINIMAL + 'aliases = [" "]\n', base) == "models.a.aliases[0]: must not be empty"
    )


def test_chat_template_builtin_name(base: Path) -> None:
    cfg = parse(MINIMAL + 'chat_template = "gemma"\n', base)
    assert cfg.models["a"].chat_template == "gemma"
    cfg = parse(MINIMAL + 'chat_template = "chatml"\n', base)
    assert cfg.models["a"].chat_template == "chatml"


def test_chat_template_file_resolved_to_absolute_path(base: Path) -> None:
    (base / "templates").mkdir()
    tpl = base / "templates" / "mine.jinja"
    tpl.write_text("{{ messages }}", encoding="utf-8")
    cfg = parse(MINIMAL + 'chat_template = "templates/mine.jinja"\n', base)
    assert cfg.models["a"].chat_template == str(tpl.resolve())


def test_chat_template_rejects_unknown(base: Path) -> None:
    msg = one_problem(MINIMAL + 'chat_template = "gemmaa"\n', base)
    assert msg.startswith("models.a.chat_template:")
    assert "'gemmaa'" in msg
    assert "gemma" in msg.split("built-in:")[1]


def test_chat_template_rejects_directory(base: Path) -> None:
    (base / "tpl").mkdir()
    assert one_problem(MINIMAL + 'chat_template = "tpl"\n', base).startswith(
        "models.a.chat_template:"
    )


@pytest.mark.parametrize("slots", [0, -1, 257])
def test_slots_out_of_range(base: Path, slots: int) -> None:
    assert (
        one_problem(MINIMAL + f"slots = {slots}\n", base)
        == f"models.a.slots: must be 1..256, got {slots}"
    )


@pytest.mark.parametrize("slots", [1, 256])
def test_slots_bounds_accepted(base: Path, slots: int) -> None:
    assert parse(MINIMAL + f"slots = {slots}\n", base).models["a"].slots == slots


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("n_ctx = 8", "models.a.n_ctx"),
        ("n_batch = 0", "models.a.n_batch"),
        # Fewer than its 12 sequences (4 slots, 8 cached prompts): llama.cpp aborted the
        # worker creating the context (GGML_ASSERT in output_reserve).
        ("n_batch = 11", "models.a.n_batch"),
        ("slots = 2\ncached_prompts = 30\nn_ctx = 16", "models.a.n_batch"),
        ("threads = 0", "models.a.threads"),
        ("n_gpu_layers = -2", "models.a.n_gpu_layers"),
        ("idle_timeout = -1", "models.a.idle_timeout"),
        ('pooling = "mean"', "models.a.pooling"),  # without embeddings = true
        # Generation defaults, held to a request's ranges (issue 22, item 1).
        ("temperature = 2.5", "models.a.temperature"),
        ("temperature = nan", "models.a.temperature"),
        ("top_p = 1.5", "models.a.top_p"),
        ("min_p = -0.1", "models.a.min_p"),
        ("top_k = -1", "models.a.top_k"),
        ("repeat_penalty = 0.0", "models.a.repeat_penalty"),
        ("presence_penalty = 3", "models.a.presence_penalty"),
        ("frequency_penalty = -3", "models.a.frequency_penalty"),
        ("seed = -2", "models.a.seed"),
        ("seed = 4294967296", "models.a.seed"),
        ('stop = [""]', "models.a.stop"),
        ("n_predict = -2", "models.a.n_predict"),
        ("n_predict = 5\nmax_tokens = 5", "models.a.n_predict"),
        ('temperature = "hot"', "models.a.temperature"),
        ("chat_template_kwargs = { add_generation_prompt = false }", "models.a.chat_template_kwargs.add_generation_prompt"),
    ],
)
def test_model_range_checks(base: Path, line: str, key: str) -> None:
    assert one_problem(MINIMAL + line + "\n", base).startswith(key + ":")


def test_generation_defaults_become_the_models_sampling_defaults(base: Path) -> None:
    """llama-server's --temp 0.2 --top-k 5 --seed 42 --n-predict 64 -r END, as a model
    table sets them (issue 22, item 1); the rest keep the protocol's defaults."""
    text = MINIMAL + 'temperature = 0.2\ntop_k = 5\nseed = 42\nn_predict = 64\nstop = ["END"]\n'
    d = parse(text, base).models["a"].defaults
    assert (d.temperature, d.top_k, d.seed, d.max_tokens, d.stop) == (0.2, 5, 42, 64, ["END"])
    assert (d.top_p, d.min_p) == (SamplingParams().top_p, SamplingParams().min_p)
    # seed -1 and n_predict -1 are llama-server's "random" and "no limit".
    d = parse(MINIMAL + "seed = -1\nn_predict = -1\n", base).models["a"].defaults
    assert (d.seed, d.max_tokens) == (None, None)
    assert parse(MINIMAL + "max_tokens = 9\n", base).models["a"].defaults.max_tokens == 9
    # [model_defaults] sets them for every model; a table's own key wins.
    text = "[model_defaults]\ntemperature = 0.0\ntop_k = 1\n" + MINIMAL + "top_k = 7\n"
    d = parse(text, base).models["a"].defaults
    assert (d.temperature, d.top_k) == (0.0, 7)


def test_bad_pooling_value(base: Path) -> None:
    msg = one_problem(MINIMAL + 'embeddings = true\npooling = "max"\n', base)
    assert msg.startswith("models.a.pooling:")


# rank: a reranker (issue 22, item 6); none: per-token vectors, on llama-server's native
# /embedding only (issue 22, item 5; the OpenAI route refuses them per request).
@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "rank", "none"])
def test_pooled_embeddings_pass_the_check(base: Path, pooling: str) -> None:
    cfg = parse(MINIMAL + f'embeddings = true\npooling = "{pooling}"\n', base)
    assert cfg.models["a"].pooling == pooling


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[server]\nport = 70000\n", "server.port"),
        ("[server]\nport = -1\n", "server.port"),
        ("[server]\nmax_body_bytes = 10\n", "server.max_body_bytes"),
        ("[supervisor]\nidle_timeout = -1\n", "supervisor.idle_timeout"),
        ("[supervisor]\nstart_timeout = -1\n", "supervisor.start_timeout"),
        ("[supervisor]\nstop_grace = -0.5\n", "supervisor.stop_grace"),
        ("[supervisor]\nload_wait = -1\n", "supervisor.load_wait"),
        ("[supervisor]\nmax_loaded_models = -1\n", "supervisor.max_loaded_models"),
        ('[supervisor]\nmemory_budget = "12 parsecs"\n', "supervisor.memory_budget"),
        ("[supervisor]\nmemory_budget = -5\n", "supervisor.memory_budget"),
        ("[supervisor]\nmemory_budget = 1.5\n", "supervisor.memory_budget"),
    ],
)
def test_server_and_supervisor_range_checks(base: Path, text: str, key: str) -> None:
    assert one_problem(text + MINIMAL, base).startswith(key + ":")


def test_capacity_settings(base: Path) -> None:
    cfg = parse(MINIMAL, base)
    assert (cfg.supervisor.max_loaded_models, cfg.supervisor.memory_budget) == (0, 0)
    assert cfg.supervisor.load_wait == 60.0
    text = '[supervisor]\nmax_loaded_models = 2\nmemory_budget = "12GiB"\nload_wait = 5\n'
    cfg = parse(text + MINIMAL, base)
    assert cfg.supervisor.max_loaded_models == 2
    assert cfg.supervisor.memory_budget == "12GiB" and cfg.supervisor.load_wait == 5


def test_more_pinned_models_than_may_be_loaded(base: Path) -> None:
    text = (
        "[supervisor]\nmax_loaded_models = 1\n"
        '[models.a]\npath = "m.gguf"\npinned = true\n'
        '[models.b]\npath = "m.gguf"\npinned = true\n'
    )
    msg = one_problem(text, base)
    assert msg.startswith("supervisor.max_loaded_models:") and "a, b" in msg


def test_no_models(base: Path) -> None:
    msg = one_problem("[server]\nport = 8080\n", base)
    assert msg.startswith("models:")
    assert one_problem("", base).startswith("models:")


def test_toml_syntax_error(base: Path) -> None:
    msg = one_problem("[models.a\npath = 1\n", base)
    assert msg.startswith("(syntax):")
    assert "line 1" in msg


def test_toml_duplicate_key_is_syntax_error(base: Path) -> None:
    assert one_problem(MINIMAL + 'path = "m.gguf"\n', base).startswith("(syntax):")


def test_multiple_problems_reported_at_once(base: Path) -> None:
    text = """
[server]
port = 99999

[models.a]
path = "missing.gguf"
slots = 0
chat_template = "nope"
aliases = ["b"]

[models.b]
path = "m.gguf"
n_ctx = 1
"""
    ps = problems(text, base)
    keys = [p.split(":")[0] for p in ps]
    assert keys == [
        "server.port",
        "models.a.slots",
        "models.a.chat_template",
        "models.a.aliases[0]",
        "models.b.n_ctx",
        "models.a.path",  # last: alone, it would not refuse the file (the model would fail)
    ]


def test_config_error_message_joins_problems() -> None:
    err = ConfigError(["a: x", "b: y"], "conf.toml")
    assert err.problems == ["a: x", "b: y"]
    assert str(err) == "conf.toml: a: x; b: y"
    assert str(ConfigError(["a: x"])) == "a: x"


def test_health_settings_are_validated(tmp_path: Path) -> None:
    write_gguf(tmp_path / "h.gguf")
    with pytest.raises(ConfigError) as err:
        parse('[supervisor]\nhealth_interval = -1\nhealth_misses = 0\n[models.m]\npath = "h.gguf"\n', tmp_path)
    assert set(err.value.problems) == {
        "supervisor.health_misses: must be at least 1, got 0",
        "supervisor.health_interval: must be a finite number >= 0, got -1.0",
    }
    ok = parse('[models.m]\npath = "h.gguf"\n', tmp_path)
    assert (ok.supervisor.health_interval, ok.supervisor.health_misses) == (10.0, 3)


def test_durations_reject_nan_and_inf(tmp_path: Path) -> None:
    """Pins 3fcb3d8: nan and inf passed the `< 0` checks."""
    # TOML spells them nan and inf; a NaN deadline would break a timer at run time.
    write_gguf(tmp_path / "m.gguf")
    text = (
        "[server]\ndrain_timeout = inf\n[supervisor]\nload_wait = nan\nidle_timeout = -inf\n"
        '[models.m]\npath = "m.gguf"\nidle_timeout = nan\n'
    )
    with pytest.raises(ConfigError) as err:
        parse(text, tmp_path)
    assert err.value.problems == [
        "server.drain_timeout: must be a finite number >= 0, got inf",
        "supervisor.idle_timeout: must be a finite number >= 0, got -inf",
        "supervisor.load_wait: must be a finite number >= 0, got nan",
        "models.m.idle_timeout: must be a finite number >= 0, got nan",
    ]


def test_deep_nesting_is_a_syntax_error_not_a_crash(tmp_path: Path) -> None:
    """Pins 3fcb3d8: tomllib's RecursionError escaped the loader, past the SIGHUP handler."""
    with pytest.raises(ConfigError) as err:
        parse("a = " + "[" * 5000 + "]" * 5000, tmp_path)
    assert err.value.problems == ["(syntax): arrays or tables nested too deeply"]


def test_model_names_and_aliases_must_be_printable(tmp_path: Path) -> None:
    """Pins 983ad72: control characters were accepted, and [models."a\\nb"] split its problem
    over two lines in the log and in systemd's STATUS=."""
    write_gguf(tmp_path / "m.gguf")
    text = '[models."a\\nb"]\npath = "m.gguf"\n[models.c]\npath = "m.gguf"\naliases = ["ok/alias:1", "t\\tab"]\n'
    with pytest.raises(ConfigError) as err:
        parse(text, tmp_path)
    assert err.value.problems == [
        "models.\"a\\nb\": model name 'a\\nb' has control characters",  # one line
        "models.c.aliases[1]: 't\\tab' has control characters",
    ]


def test_default_model_names_a_model_or_an_alias(base: Path) -> None:
    text = '[server]\ndefault_model = "{}"\n[models.a]\npath = "m.gguf"\naliases = ["gpt-4o"]\n'
    assert parse(text.format("a"), base).server.default_model == "a"
    assert parse(text.format("gpt-4o"), base).server.default_model == "gpt-4o"
    assert one_problem(text.format("nope"), base) == (
        "server.default_model: 'nope' is neither a model nor an alias in [models]"
    )


def test_tool_format_and_reasoning_options(base: Path) -> None:
    cfg = parse(MINIMAL + 'tool_format = "hermes"\nreasoning = false\n', base)
    spec = cfg.models["a"]
    assert spec.tool_format == "hermes" and spec.reasoning is False


def test_bad_tool_format_names_the_key(base: Path) -> None:
    assert one_problem(MINIMAL + 'tool_format = "xml"\n', base).startswith("models.a.tool_format")


def test_builtin_template_takes_only_the_generic_tool_format(base: Path) -> None:
    msg = one_problem(MINIMAL + 'chat_template = "gemma"\ntool_format = "hermes"\n', base)
    assert msg.startswith("models.a.tool_format:") and "generic" in msg
    assert parse(MINIMAL + 'chat_template = "gemma"\ntool_format = "generic"\n', base).models["a"].tool_format == "generic"


# ---- the prompt cache and speculative decoding (issue 24) -------------------------------------------


def test_prompt_cache_and_speculation_defaults_and_paths(base: Path) -> None:
    spec = parse(MINIMAL, base).models["a"]
    assert (spec.cached_prompts, spec.prompt_cache_dir, spec.spec_type, spec.draft_max) == (None, None, "ngram", 16)
    spec = parse(MINIMAL + 'prompt_cache_dir = "cache"\ncached_prompts = 0\nspec_type = "none"\n', base).models["a"]
    # Relative to the config file, as a model's path is: the worker knows nothing of it.
    assert spec.prompt_cache_dir == str((base / "cache").resolve())
    assert (spec.cached_prompts, spec.spec_type) == (0, "none")


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("cached_prompts = -1", "models.a.cached_prompts: must be 0..252 (256 sequences less the slots), got -1"),
        ("cached_prompts = 253", "models.a.cached_prompts: must be 0..252 (256 sequences less the slots), got 253"),
        ("prompt_cache_bytes = -5", "models.a.prompt_cache_bytes: must be 0 or more bytes, got -5"),
        ("prompt_cache_disk_bytes = -1", "models.a.prompt_cache_disk_bytes: must be 0 or more bytes, got -1"),
        ("draft_max = 0", "models.a.draft_max: must be 1..256, got 0"),
        ('spec_type = "draft"', 'models.a.spec_type: "draft" needs draft_model'),
        ('draft_model = "missing.gguf"', "models.a.draft_model: "),
        ("draft_p_min = 1.5", "models.a.draft_p_min: must be 0..1, got 1.5"),
        ('prompt_cache_dir = "m.gguf"', "exists and is not a folder"),
    ],
)
def test_prompt_cache_and_speculation_bad_values_name_their_key(base: Path, line: str, problem: str) -> None:
    assert problem in one_problem(MINIMAL + line + "\n", base)


def test_a_draft_model_path_is_relative_to_the_config(base: Path) -> None:
    spec = parse(MINIMAL + 'draft_model = "m.gguf"\ndraft_p_min = 0.5\n', base).models["a"]
    assert (spec.draft_model, spec.draft_p_min) == (str((base / "m.gguf").resolve()), 0.5)


def test_a_spec_type_that_is_neither_is_refused(base: Path) -> None:
    assert "spec_type" in one_problem(MINIMAL + 'spec_type = "eagle"\n', base)
