"""The pure side of `corral config set/unset/add-model/remove-model/show`: key paths, values
typed by the schema, tomlkit edits that leave every byte outside the edited table alone,
and the effective config with its keys masked."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from supervisor.config import edit as config_edit, show as config_show
from supervisor.config import parse
from supervisor.config.key_paths import EditError, KeyPath, resolve, split, typed_value
from tests.harness import write_gguf
from tests.secrets import secret

# Comments everywhere, odd spacing, a quoted model name with a dot, an inline array of
# tables, a model with comments after its last key: everything a hand-kept file holds.
RICH = """\
# Corral on the lab box.   Kept by hand; do not reformat.
#   (three spaces above on purpose)

[server]
host   =   "127.0.0.1"    # loopback only
port = 8080
# api_keys = ["commented-out"]

[supervisor]   # capacity
idle_timeout = 600   # ten minutes
memory_budget = "12GiB"

# ---- models ---------------------------------------------------------------------------

[models.qwen]
path = "qwen.gguf"          # the chat model
aliases = [ "q",  "chat" ]  # odd spacing inside
slots = 4
# trailing comment of qwen, before a blank line

[models."qwen2.5"]
path = 'qwen25.gguf'
n_ctx = 8192   # long
  # an indented comment

[models.embed]
path = "embed.gguf"
embeddings = true
# the end
"""


def _tables(text: str) -> dict[str, tuple[int, int]]:
    """Each table header's text -> (start, end) offsets of the table: from its header to
    the next header, as a person reads a TOML file."""
    heads = [m for m in re.finditer(r"(?m)^\[[^\n]*", text)]
    spans: dict[str, tuple[int, int]] = {}
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        spans[m.group(0).split("#")[0].strip()] = (m.start(), end)
    return spans


def assert_only_table_changed(old: str, new: str, header: str) -> None:
    """Every byte before and after `header`'s table is the same in `old` and `new`."""
    o, n = _tables(old)[header], _tables(new)[header]
    assert new[: n[0]] == old[: o[0]]
    assert new[n[1]:] == old[o[1]:]


def test_set_replaces_one_line_keeping_its_comment_and_every_other_byte() -> None:
    new = config_edit.set_key(RICH, "models.qwen.slots", ["8"])
    assert_only_table_changed(RICH, new, "[models.qwen]")
    assert new == RICH.replace("slots = 4\n", "slots = 8\n")
    assert tomllib.loads(new)["models"]["qwen"]["slots"] == 8  # an integer, not "8"


def test_set_a_new_key_lands_after_the_tables_last_key_not_after_its_trailing_comments() -> None:
    new = config_edit.set_key(RICH, "models.qwen.n_ctx", ["2048"])
    assert_only_table_changed(RICH, new, "[models.qwen]")
    assert "slots = 4\nn_ctx = 2048\n# trailing comment of qwen" in new


def test_set_on_a_quoted_model_name_with_a_dot() -> None:
    new = config_edit.set_key(RICH, 'models."qwen2.5".slots', ["2"])
    assert_only_table_changed(RICH, new, '[models."qwen2.5"]')
    assert tomllib.loads(new)["models"]["qwen2.5"]["slots"] == 2
    new = config_edit.set_key(RICH, "models.'qwen2.5'.n_ctx", ["1024"])  # a literal string too
    assert tomllib.loads(new)["models"]["qwen2.5"]["n_ctx"] == 1024


def test_set_in_a_section_the_file_lacks_appends_it_and_keeps_the_rest() -> None:
    text = RICH.replace("[supervisor]   # capacity\nidle_timeout = 600   # ten minutes\nmemory_budget = \"12GiB\"\n\n", "")
    new = config_edit.set_key(text, "supervisor.load_wait", ["30"])
    assert new.startswith(text)
    assert tomllib.loads(new)["supervisor"] == {"load_wait": 30.0}


@pytest.mark.parametrize(
    ("key", "words", "value"),
    [
        ("server.port", ["9000"], 9000),
        ("server.host", ["0.0.0.0"], "0.0.0.0"),  # not a TOML value: a string
        ("server.default_model", ["8"], "8"),  # a str key takes "8" as text
        ("server.drain_timeout", ["5"], 5.0),  # an int for a float key is written as a float
        ("server.drain_timeout", ["2.5"], 2.5),
        ("supervisor.idle_timeout", ["10m"], "10m"),  # a duration stays as written
        ("models.qwen.queue_timeout", ["1h30m"], "1h30m"),
        ("server.allow_insecure_bind", ["true"], True),
        ("server.log_format", ["json"], "json"),
        ("supervisor.memory_budget", ["8GB"], "8GB"),
        ("supervisor.memory_budget", ["0"], 0),
        ("models.qwen.aliases", ['["a", "b"]'], ["a", "b"]),  # a TOML (and JSON) array
        ("models.qwen.aliases", ["a", "b", "c"], ["a", "b", "c"]),  # one word per item
        ("models.qwen.aliases", ["solo"], ["solo"]),
        ("models.qwen.aliases", ["[]"], []),
        ("models.qwen.pooling", ["mean"], "mean"),
        ("server.cors_origins", ['["https://a.example"]'], ["https://a.example"]),
    ],
)
def test_values_are_typed_by_the_schema(key: str, words: list[str], value: object) -> None:
    got = typed_value(resolve(key), words)
    assert got == value and type(got) is type(value)


def test_an_api_key_table_is_accepted_as_json_and_written_inline() -> None:
    key = secret("edit")
    new = config_edit.set_key(RICH, "server.api_keys", [f'[{{"key": "{key}", "name": "ci"}}]'])
    assert_only_table_changed(RICH, new, "[server]")
    assert tomllib.loads(new)["server"]["api_keys"] == [{"key": key, "name": "ci"}]
    assert "[[" not in new  # not an array of tables elsewhere in the file


@pytest.mark.parametrize(
    ("key", "words", "message"),
    [
        ("server.port", ["abc"], "server.port: expected int, got 'abc'"),
        ("server.port", ["1", "2"], "server.port: takes one value, got 2"),
        ("models.qwen.embeddings", ["yes"], "models.qwen.embeddings: expected bool, got 'yes'"),
        ("server.log_format", ["xml"], 'server.log_format: expected one of "text", "json", got \'xml\''),
        ("models.qwen.aliases", ["[1]"], "models.qwen.aliases: expected a list of str"),
        ("models.qwen.slots", ["null"], "models.qwen.slots: expected int, got 'null'"),
        ("supervisor.idle_timeout", ["ten"], 'supervisor.idle_timeout: expected a number of seconds or a duration such as "10m", got \'ten\''),
    ],
)
def test_a_mistyped_value_is_refused_naming_the_key(key: str, words: list[str], message: str) -> None:
    with pytest.raises(EditError) as exc:
        typed_value(resolve(key), words)
    assert str(exc.value).startswith(message)


def test_a_refused_secret_is_never_quoted() -> None:
    key = secret("typo")
    with pytest.raises(EditError) as exc:
        typed_value(resolve("server.api_keys"), [f'[{{"key": "{key}", "nmae": "typo"}}]'])
    assert key not in str(exc.value) and str(exc.value).startswith("server.api_keys: expected a list")


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("server.prot", "server.prot: unknown key; did you mean server.port?"),
        ("supervisor.idle_timout", "supervisor.idle_timout: unknown key; did you mean supervisor.idle_timeout?"),
        ("models.qwen.slot", "models.qwen.slot: unknown key; did you mean models.qwen.slots?"),
        ("modles.qwen.slots", "modles.qwen.slots: unknown key"),
        ("server.port.x", "server.port.x: unknown key"),
        ("server", "server: a section, not a key; name one of its keys (server.port)"),
        ("models", "models: a section, not a key; name one of its keys (models.NAME.slots)"),
        ("models.qwen", "models.qwen: a whole model is not one value"),
        ("models.qwen2.5.slots", 'models.qwen2.5.slots: expected models.NAME.KEY; quote a name that holds dots: models."qwen2.5".slots'),
        ("a..b", "'a..b': not a key path"),
        # A key path cannot smuggle a value or a second key into the parse.
        ("server.port = 1 #", "'server.port = 1 #': not a key path"),
        ("server.port\nserver.host", "'server.port\\nserver.host': not a key path"),
        ("", "(key): the key path is empty"),
    ],
)
def test_an_unknown_key_path_is_refused_by_name_with_the_closest_key(key: str, message: str) -> None:
    with pytest.raises(EditError) as exc:
        config_edit.set_key(RICH, key, ["1"])
    assert str(exc.value).startswith(message)


def test_a_key_of_a_model_the_file_lacks_is_refused_with_the_closest_model() -> None:
    with pytest.raises(EditError, match=r"models.qwne: no such model \(models: qwen, \"qwen2.5\", embed\); did you mean qwen\?"):
        config_edit.set_key(RICH, "models.qwne.slots", ["2"])


def test_a_crlf_file_keeps_crlf_in_the_lines_an_edit_adds() -> None:
    crlf = RICH.replace("\n", "\r\n")
    for new in (
        config_edit.set_key(crlf, "models.qwen.n_ctx", ["2048"]),
        config_edit.add_model(crlf, "n", {"path": ["n.gguf"], "slots": ["2"]}),
    ):
        assert "\n" not in new.replace("\r\n", "")
    assert config_edit.remove_model(config_edit.add_model(crlf, "n", {"path": ["n.gguf"]}), "n") == crlf


def test_split_reads_quoting_as_toml_does() -> None:
    assert split('models."qwen2.5".slots') == ["models", "qwen2.5", "slots"]
    assert split("models.'a b'.slots") == ["models", "a b", "slots"]
    assert split('models."a\\"b".n_ctx') == ["models", 'a"b', "n_ctx"]
    assert str(KeyPath("models", "slots", "qwen2.5")) == 'models."qwen2.5".slots'


def test_unset_removes_the_line_and_only_it() -> None:
    new, was_set = config_edit.unset_key(RICH, 'models."qwen2.5".n_ctx')
    assert was_set
    assert_only_table_changed(RICH, new, '[models."qwen2.5"]')
    assert new == RICH.replace("n_ctx = 8192   # long\n", "")


def test_unset_of_a_key_not_in_the_file_changes_nothing() -> None:
    assert config_edit.unset_key(RICH, "server.tls_cert") == (RICH, False)
    assert config_edit.unset_key(RICH, "supervisor.load_wait") == (RICH, False)


def test_a_required_key_cannot_be_unset() -> None:
    with pytest.raises(EditError, match=r"^models.qwen.path: required, cannot be unset"):
        config_edit.unset_key(RICH, "models.qwen.path")


def test_add_model_appends_a_table_and_keeps_the_file_before_it() -> None:
    new = config_edit.add_model(
        RICH, "llama 3.1", {"path": ["llama.gguf"], "aliases": ['["l"]'], "slots": ["2"], "embeddings": ["true"]}
    )
    assert new.startswith(RICH)
    assert new[len(RICH):] == '\n[models."llama 3.1"]\npath = "llama.gguf"\naliases = ["l"]\nslots = 2\nembeddings = true\n'


def test_add_model_to_a_file_without_models() -> None:
    new = config_edit.add_model("# nothing yet\n", "a", {"path": ["a.gguf"]})
    assert new.startswith("# nothing yet\n")
    assert tomllib.loads(new) == {"models": {"a": {"path": "a.gguf"}}}


def test_add_model_refuses_an_existing_name_and_a_bad_option() -> None:
    with pytest.raises(EditError, match=r'^models."qwen2.5": already exists'):
        config_edit.add_model(RICH, "qwen2.5", {"path": ["x.gguf"]})
    with pytest.raises(EditError, match=r"^models.new.slots: expected int, got 'many'"):
        config_edit.add_model(RICH, "new", {"path": ["x.gguf"], "slots": ["many"]})
    with pytest.raises(EditError, match=r"^models.new.path: required key is missing"):
        config_edit.add_model(RICH, "new", {"slots": ["2"]})


def test_remove_model_removes_its_table_and_nothing_else() -> None:
    new = config_edit.remove_model(RICH, "qwen2.5")
    start, end = _tables(RICH)['[models."qwen2.5"]']
    assert new == RICH[:start] + RICH[end:]
    with pytest.raises(EditError, match=r"^models.qwen3: no such model .*did you mean qwen\?"):
        config_edit.remove_model(RICH, "qwen3")


def test_a_file_tomlkit_cannot_read_is_refused_as_syntax() -> None:
    with pytest.raises(EditError, match=r"^\(syntax\): "):
        config_edit.set_key("[server\nport = 1\n", "server.port", ["2"])


def test_show_fills_every_default_and_masks_every_key(tmp_path: Path) -> None:
    write_gguf(tmp_path / "a.gguf")
    api, named, admin = secret("show-api"), secret("show-table"), secret("show-admin")
    text = f"""
[server]
api_keys = ["{api}", {{ key = "{named}", name = "ci", models = ["a"] }}]
admin_keys = ["{admin}"]
[models.a]
path = "a.gguf"
"""
    data = config_show.effective(parse(text, tmp_path))
    rendered = config_show.to_toml(data)
    for key in (api, named, admin):
        assert key not in rendered and key not in repr(data)
    assert data["server"]["api_keys"] == [
        "***", {
            "key": "***", "name": "ci", "models": ["a"], "cache_group": None, "max_tokens": None,
            "requests_per_minute": None, "tokens_per_minute": None, "tokens_per_day": None, "max_in_flight": None,
            "priority": "normal", "request_priority": False,
        }
    ]
    assert data["server"]["admin_keys"] == ["***"]
    # Every key of the schema is there, unset ones as comments in TOML.
    from supervisor.config import ModelConfig, ServerConfig, SupervisorConfig

    assert set(data["server"]) == set(ServerConfig.__struct_fields__)
    assert set(data["supervisor"]) == set(SupervisorConfig.__struct_fields__)
    assert set(data["models"]["a"]) == set(ModelConfig.__struct_fields__)
    assert data["models"]["a"]["slots"] == 4 and data["models"]["a"]["path"] == str(tmp_path / "a.gguf")
    assert "# default_model: not set" in rendered
    assert tomllib.loads(rendered)["models"]["a"]["n_ctx"] == 4096
