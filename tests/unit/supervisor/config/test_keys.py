"""Keys: where they come from, how they match, and that no problem quotes one."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import keys
from supervisor.config import ConfigError, load, parse
from supervisor.config.key_rules import KeyRules
from supervisor.config.keys import ApiKeyTable, KeyFileError, Keyring, KeySource
from tests.harness import write_gguf, config_text
from tests.secrets import secret

ALICE = secret("alice")
BOB = secret("bob")
ROOT = secret("root")


def _ring(*sources: KeySource) -> Keyring:
    ring, bad = keys.keyring(sources, {"a": "a", "alias-a": "a", "b": "b"})
    assert bad == []
    return ring


def test_match_finds_the_key_that_was_sent_and_nothing_else() -> None:
    ring = _ring(KeySource("server.api_keys[0]", ALICE, "alice", None), KeySource("server.api_keys[1]", BOB, None, None))
    alice = ring.match(ALICE)
    assert alice is not None and alice.name == "alice"
    bob = ring.match(BOB)
    assert bob is not None and bob.name == "api_keys[1]"  # named by where it is configured
    for wrong in ("", ALICE[:-1], ALICE + "x", ALICE.upper(), f"Bearer {ALICE}"):
        assert ring.match(wrong) is None
    assert ring.api_keys_required and not ring.admin_keys_configured


def test_keys_are_kept_as_digests_only() -> None:
    ring = _ring(KeySource("server.api_keys[0]", ALICE, None, None))
    assert ALICE not in repr(ring) and ALICE.encode() not in repr(ring).encode()
    assert ring.keys[0].digest == keys.digest(ALICE)


def test_scopes_resolve_aliases_to_model_names() -> None:
    ring = _ring(KeySource("server.api_keys[0]", ALICE, None, ("alias-a",)))
    key = ring.match(ALICE)
    assert key is not None and key.models == frozenset({"a"})
    assert key.may_use("a") and not key.may_use("b")


def test_a_scope_naming_an_unknown_model_is_a_problem() -> None:
    _, bad = keys.keyring([KeySource("server.api_keys[0]", ALICE, None, ("a", "nope"))], {"a": "a"})
    assert bad == ["server.api_keys[0].models: 'nope' is neither a model nor an alias in [models]"]


def test_admin_keys_alone_do_not_require_keys_on_inference_routes() -> None:
    ring = _ring(*keys.from_config([], [ROOT]))
    assert ring.admin_keys_configured and not ring.api_keys_required
    root = ring.match(ROOT)
    assert root is not None and root.admin and root.models is None and root.name == "admin_keys[0]"


def test_config_entries_strings_and_tables() -> None:
    sources = list(keys.from_config([ALICE, ApiKeyTable(key=BOB, name="bob", models=["a"])], [ROOT]))
    assert [(s.where, s.name, s.models, s.admin) for s in sources] == [
        ("server.api_keys[0]", None, None, False),
        ("server.api_keys[1]", "bob", ("a",), False),
        ("server.admin_keys[0]", None, None, True),
    ]


def test_environment_keys_split_on_commas_and_spaces() -> None:
    sources = list(keys.from_env(f" {ALICE},{BOB}  {ROOT} ,"))
    assert [s.key for s in sources] == [ALICE, BOB, ROOT]
    assert [s.where for s in sources] == ["CORRAL_API_KEYS[0]", "CORRAL_API_KEYS[1]", "CORRAL_API_KEYS[2]"]
    assert list(keys.from_env(None)) == [] and list(keys.from_env("")) == []


def test_keys_file_lines() -> None:
    text = f"# team keys\n\n{ALICE} name=alice models=a,b\n  {BOB}\n#{ROOT}\n"
    sources = list(keys.parse_file(text, "server.api_keys_file"))
    assert [(s.where, s.key, s.name, s.models) for s in sources] == [
        ("server.api_keys_file:3", ALICE, "alice", ("a", "b")),
        ("server.api_keys_file:4", BOB, None, None),
    ]


@pytest.mark.parametrize("line", [f"{ALICE} owner=x", f"{ALICE} name", f"{ALICE} name=", f"{ALICE} {BOB}"])
def test_a_bad_keys_file_line_is_named_without_quoting_it(line: str) -> None:
    with pytest.raises(KeyFileError) as exc:
        list(keys.parse_file(f"{BOB}\n{line}\n", "keys.txt"))
    assert str(exc.value).startswith("keys.txt:2: ")
    assert ALICE not in str(exc.value) and BOB not in str(exc.value)


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("short", "at least 8 characters"),
        ("has space in it", "printable ASCII without spaces"),
        ("tab\there-123", "printable ASCII without spaces"),
        ("clé-secrète-123", "printable ASCII without spaces"),
    ],
)
def test_malformed_keys_are_problems_that_do_not_quote_them(key: str, problem: str) -> None:
    found = list(keys.problems([KeySource("server.api_keys[0]", key, None, None)]))
    assert len(found) == 1 and found[0].startswith("server.api_keys[0]: ") and problem in found[0]
    assert key not in found[0]


def test_the_same_key_twice_and_the_same_name_twice_are_problems() -> None:
    found = list(
        keys.problems(
            [
                KeySource("server.api_keys[0]", ALICE, "team", None),
                KeySource("server.api_keys_file:2", ALICE, None, None),
                KeySource("server.api_keys[1]", BOB, "team", None),
            ]
        )
    )
    assert found == [
        "server.api_keys_file:2: the same key as server.api_keys[0]",
        "server.api_keys[1].name: 'team' is already the name of server.api_keys[0]",
    ]


@pytest.mark.parametrize("name", ["api_keys[4]", "admin_keys[0]", "CORRAL_API_KEYS[2]", "keys.txt:7"])
def test_a_configured_name_of_the_form_corral_gives_unnamed_keys_is_a_problem(name: str) -> None:
    # Issue 40: a key named "api_keys[4]" was accepted, and shared its name (then owned by
    # name, its stored responses) with the unnamed key at that place.
    found = list(keys.problems([KeySource("server.api_keys[0]", ALICE, name, None)]))
    assert len(found) == 1 and found[0].startswith("server.api_keys[0].name: ") and "form" in found[0]


def test_what_a_key_owns_is_its_digest_not_its_name() -> None:
    ring = _ring(KeySource("server.api_keys[0]", ALICE, "team", None), KeySource("server.api_keys[1]", BOB, None, None))
    alice, bob = ring.keys
    assert alice.owner == keys.digest(ALICE).hex() and bob.owner == keys.digest(BOB).hex()
    assert "team" not in alice.owner and ALICE not in alice.owner


def test_keys_file_cache_group_and_max_tokens() -> None:
    [s] = keys.parse_file(f"{ALICE} name=alice cache_group=team max_tokens=512\n", "keys.txt")
    assert (s.cache_group, s.max_tokens) == ("team", 512)
    ring = _ring(s)
    assert (ring.keys[0].cache_group, ring.keys[0].max_tokens) == ("team", 512)
    with pytest.raises(KeyFileError, match="max_tokens"):
        list(keys.parse_file(f"{ALICE} max_tokens=lots\n", "keys.txt"))
    found = list(keys.problems([KeySource("keys.txt:1", ALICE, None, None, max_tokens=0, cache_group=" ")]))
    assert found == ["keys.txt:1.cache_group: must be printable and not empty", "keys.txt:1.max_tokens: must be at least 1"]


def _write(tmp_path: Path, server: dict[str, object]) -> Path:
    write_gguf(tmp_path / "dummy.gguf")
    path = tmp_path / "config.toml"
    path.write_text(config_text({"a": {"aliases": ["alias-a"]}, "b": {}}, server))
    return path


def test_load_gathers_config_file_and_environment_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "keys.txt").write_text(f"{BOB} name=bob models=alias-a\n")
    monkeypatch.setenv("CORRAL_API_KEYS", secret("env"))
    cfg = load(_write(tmp_path, {"api_keys": [ALICE], "api_keys_file": "keys.txt", "admin_keys": [ROOT]}))
    names = {k.name: (k.admin, k.models) for k in cfg.keys.keys}
    assert names == {
        "api_keys[0]": (False, None),
        "admin_keys[0]": (True, None),
        "bob": (False, frozenset({"a"})),
        "CORRAL_API_KEYS[0]": (False, None),
    }
    assert cfg.server.api_keys_file == str(tmp_path / "keys.txt")  # resolved beside the config


def test_key_problems_are_config_errors_without_the_keys(tmp_path: Path) -> None:
    (tmp_path / "keys.txt").write_text(f"{ALICE} colour=red\n")
    path = _write(tmp_path, {"api_keys": [ALICE, "tiny"], "api_keys_file": "keys.txt", "admin_keys": [ALICE]})
    with pytest.raises(ConfigError) as exc:
        load(path)
    text = str(exc.value)
    assert "server.api_keys[1]: a key must be at least 8 characters" in text
    assert "server.admin_keys[0]: the same key as server.api_keys[0]" in text
    assert "server.api_keys_file: keys.txt:1: after the key, only name=NAME, models=A,B, cache_group=GROUP, max_tokens=N and requests_per_minute=" in text
    assert ALICE not in text and "tiny" not in text


def test_a_missing_keys_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load(_write(tmp_path, {"api_keys_file": "nope.txt"}))
    assert any(p.startswith("server.api_keys_file: cannot read") for p in exc.value.problems)


def test_a_key_table_with_an_unknown_field_is_a_config_error(tmp_path: Path) -> None:
    text = config_text({"a": {}}).replace("[server]\n", f'[server]\napi_keys = [{{ key = "{ALICE}", owner = "x" }}]\n')
    write_gguf(tmp_path / "dummy.gguf")
    with pytest.raises(ConfigError) as exc:
        parse(text, tmp_path)
    assert exc.value.problems == ["server.api_keys[0].owner: unknown key"]


def test_a_keys_quotas_and_priority_come_from_its_table_and_its_file_line() -> None:
    [table] = keys.from_config(
        [ApiKeyTable(key=ALICE, tokens_per_day=5000, max_in_flight=2, priority="interactive")], []
    )
    assert table.rules.tokens_per_day == 5000 and table.rules.max_in_flight == 2
    assert table.rules.rank == 0 and table.rules.limited
    [line] = keys.parse_file(f"{BOB} requests_per_minute=30 priority=batch request_priority=true\n", "keys.txt")
    assert line.rules.requests_per_minute == 30 and line.rules.rank == 2 and line.rules.request_priority
    [plain] = keys.parse_file(f"{BOB}\n", "keys.txt")
    assert not plain.rules.limited and plain.rules.rank == 1
    ring = _ring(line)
    assert ring.keys[0].rules == line.rules


@pytest.mark.parametrize(
    "field, said",
    [("priority=urgent", "$.priority"), ("tokens_per_minute=lots", "$.tokens_per_minute"), ("request_priority=maybe", "$.request_priority")],
)
def test_a_bad_rule_on_a_keys_file_line_names_the_line_and_the_field(field: str, said: str) -> None:
    with pytest.raises(KeyFileError) as err:
        list(keys.parse_file(f"{BOB}\n{ALICE} {field}\n", "keys.txt"))
    assert "keys.txt:2" in str(err.value) and said in str(err.value) and ALICE not in str(err.value)


def test_a_quota_below_one_is_a_problem_naming_it() -> None:
    rules = KeyRules(tokens_per_minute=0, max_in_flight=-1)
    found = list(keys.problems([KeySource("server.api_keys[0]", ALICE, None, None, rules=rules)]))
    assert any("server.api_keys[0].tokens_per_minute" in p for p in found)
    assert any("server.api_keys[0].max_in_flight" in p for p in found)
