"""supervisor/config/models_dir.py and its hook in config.parse: a folder's *.gguf files as models
(stems, split sets, clashes with tables and aliases, files that are not ready)."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from supervisor.config import search as config_search
from supervisor.config import ConfigError, parse, without_file
from supervisor.config.models_dir import Entry, fingerprint, pair_projectors, scan
from supervisor.config.upstreams import MISSING_PATH


def gguf_bytes(architecture: str | None = "llama", flags: tuple[str, ...] = ()) -> bytes:
    """The smallest file whose header reads as a GGUF's (no tensors), with each of `flags`
    a bool key set true (a projector's clip.has_vision_encoder)."""
    pairs = b""
    n = 0
    if architecture is not None:
        key, value = b"general.architecture", architecture.encode()
        pairs = struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) + struct.pack("<Q", len(value)) + value
        n = 1
    for flag in flags:
        key = flag.encode()
        pairs += struct.pack("<Q", len(key)) + key + struct.pack("<I", 7) + b"\x01"
        n += 1
    return b"GGUF" + struct.pack("<IQQ", 3, 0, n) + pairs


PROJECTOR = gguf_bytes("clip", ("clip.has_vision_encoder",))


def put(folder: Path, *names: str, data: bytes | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(gguf_bytes() if data is None else data)


def problems_of(text: str, base: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text, base)
    return info.value.problems


# ---- scan(): the pure part ----------------------------------------------------------------------


def test_each_gguf_is_a_model_named_after_its_stem_and_other_files_are_ignored() -> None:
    found = scan(Entry(n) for n in ["qwen3-8b.Q4_K_M.gguf", "b.GGUF", "README.md", "a.gguf.part", ".c.gguf"])
    assert found.models == {"qwen3-8b.Q4_K_M": "qwen3-8b.Q4_K_M.gguf", "b": "b.GGUF"}
    assert found.problems == [] and found.skipped == []


def test_a_split_set_is_one_model_whose_file_is_its_first_part() -> None:
    names = ["big-00002-of-00003.gguf", "big-00001-of-00003.gguf", "big-00003-of-00003.gguf", "x.gguf"]
    found = scan(Entry(n) for n in names)
    assert found.models == {"big": "big-00001-of-00003.gguf", "x": "x.gguf"}
    assert found.problems == []


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (["s-00001-of-00003.gguf", "s-00003-of-00003.gguf"], "s-00001-of-00003.gguf: split set lacks part(s) 00002 of 00003"),
        (["s-00002-of-00002.gguf"], "s-00002-of-00002.gguf: split set lacks part(s) 00001 of 00002"),
        (["s-00001-of-00002.gguf", "s-00002-of-00003.gguf"], "s-00001-of-00002.gguf: split parts disagree on how many there are (00002, 00003)"),
        (["s-00001-of-00001.gguf", "s-00002-of-00001.gguf"], "s-00001-of-00001.gguf: split part 00002 is outside 00001..00001"),
        (["s-00000-of-00001.gguf", "s-00001-of-00001.gguf"], "s-00000-of-00001.gguf: split part 00000 is outside 00001..00001"),
    ],
)
def test_a_broken_split_set_is_a_problem_naming_a_file_of_it(names: list[str], problem: str) -> None:
    found = scan([Entry("ok.gguf"), *(Entry(n) for n in names)])
    assert found.problems == [problem]
    assert found.models == {"ok": "ok.gguf"}  # the rest of the folder is unaffected


@pytest.mark.parametrize(
    "names",
    [["a.gguf", "a-00001-of-00001.gguf"], ["A.gguf", "A.GGUF"]],
    ids=["file-and-split-set", "suffix-case"],
)
def test_two_files_that_would_be_one_model_are_a_problem(names: list[str]) -> None:
    found = scan(Entry(n) for n in names)
    assert found.models == {}
    assert len(found.problems) == 1 and "would be model" in found.problems[0], found.problems


def test_a_file_not_ready_is_passed_over_with_its_reason_not_failed() -> None:
    found = scan([Entry("a.gguf"), Entry("b.gguf", "not a GGUF file"), Entry("s-00001-of-00002.gguf"),
                  Entry("s-00002-of-00002.gguf", "cannot read")])
    assert found.models == {"a": "a.gguf"}
    assert found.skipped == ["b.gguf: not a GGUF file", "s-00002-of-00002.gguf: cannot read"]
    assert found.problems == []


def test_a_name_with_control_characters_is_a_problem() -> None:
    found = scan([Entry("bad\nname.gguf")])
    assert found.models == {} and "cannot be a model name" in found.problems[0]
    assert "\n" not in found.problems[0]


# ---- through config.parse -----------------------------------------------------------------------


def test_models_dir_serves_every_gguf_with_every_default(tmp_path: Path) -> None:
    put(tmp_path / "models", "a.gguf", "b.gguf")
    (tmp_path / "models" / "notes.txt").write_text("not a model")
    put(tmp_path / "models" / "sub" / "deeper", "deeper.gguf")  # two levels down: never read
    cfg = parse('[server]\nmodels_dir = "models"\n', tmp_path)  # relative to the config's folder
    assert sorted(cfg.models) == ["a", "b"]
    assert cfg.models["a"].path == tmp_path / "models" / "a.gguf"
    assert cfg.models["a"].n_ctx == 4096 and cfg.models["a"].aliases == ()
    assert cfg.server.models_dir == str(tmp_path / "models")


def test_a_table_of_the_same_name_overrides_and_takes_the_file_as_its_path(tmp_path: Path) -> None:
    put(tmp_path, "a.gguf", "b.gguf", "other.gguf")
    text = (
        '[server]\nmodels_dir = "."\n'
        '[models.a]\nn_ctx = 512\naliases = ["fast"]\n'
        '[models.b]\npath = "other.gguf"\n'
    )
    cfg = parse(text, tmp_path)
    assert cfg.models["a"].path == tmp_path / "a.gguf" and cfg.models["a"].n_ctx == 512
    assert cfg.resolve("fast") is cfg.models["a"]
    assert cfg.models["b"].path == tmp_path / "other.gguf"  # its own path wins
    assert sorted(cfg.models) == ["a", "b", "other"]


def test_a_file_named_like_an_alias_is_left_to_the_table(tmp_path: Path) -> None:
    put(tmp_path, "m.gguf", "fast.gguf")
    cfg = parse('[server]\nmodels_dir = "."\n[models.a]\npath = "m.gguf"\naliases = ["fast"]\n', tmp_path)
    assert sorted(cfg.models) == ["a", "m"]
    assert cfg.resolve("fast") is cfg.models["a"]


def test_a_table_without_path_and_without_a_file_still_needs_its_path(tmp_path: Path) -> None:
    put(tmp_path, "a.gguf")
    ps = problems_of('[server]\nmodels_dir = "."\n[models.typo]\nn_ctx = 512\n', tmp_path)
    assert ps == [f"models.typo.path: {MISSING_PATH}"]


def test_model_defaults_apply_to_every_model_and_a_table_wins(tmp_path: Path) -> None:
    put(tmp_path, "a.gguf", "b.gguf")
    text = '[server]\nmodels_dir = "."\n[model_defaults]\nn_ctx = 1024\nslots = 2\n[models.b]\nn_ctx = 2048\n'
    cfg = parse(text, tmp_path)
    assert (cfg.models["a"].n_ctx, cfg.models["a"].slots) == (1024, 2)
    assert (cfg.models["b"].n_ctx, cfg.models["b"].slots) == (2048, 2)


@pytest.mark.parametrize(
    ("defaults", "problem"),
    [
        ('n_ctx = "big"', 'model_defaults.n_ctx: expected an integer, got "big"'),
        ("no_such_key = 1", "model_defaults.no_such_key: unknown key"),
        ('aliases = ["x"]', "model_defaults.aliases: set per model, not for all"),
    ],
)
def test_a_bad_model_default_is_reported_once_under_its_own_name(tmp_path: Path, defaults: str, problem: str) -> None:
    put(tmp_path, "a.gguf", "b.gguf")
    ps = problems_of(f'[server]\nmodels_dir = "."\n[model_defaults]\n{defaults}\n', tmp_path)
    assert ps == [problem]


def test_a_missing_or_empty_folder_is_a_problem(tmp_path: Path) -> None:
    ps = problems_of('[server]\nmodels_dir = "nowhere"\n', tmp_path)
    assert f"server.models_dir: no such folder: {tmp_path / 'nowhere'}" in ps
    put(tmp_path, "file.gguf")
    ps = problems_of('[server]\nmodels_dir = "file.gguf"\n', tmp_path)
    assert f"server.models_dir: not a folder: {tmp_path / 'file.gguf'}" in ps
    (tmp_path / "empty").mkdir()
    ps = problems_of('[server]\nmodels_dir = "empty"\n', tmp_path)
    assert f"server.models_dir: no *.gguf model in {tmp_path / 'empty'}" in ps


def test_a_broken_split_set_fails_the_config_naming_the_file(tmp_path: Path) -> None:
    put(tmp_path, "a.gguf", "big-00001-of-00002.gguf")
    ps = problems_of('[server]\nmodels_dir = "."\n', tmp_path)
    assert ps == ["server.models_dir: big-00001-of-00002.gguf: split set lacks part(s) 00002 of 00002"]


def test_a_half_written_file_or_an_unpaired_projector_is_passed_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    put(tmp_path, "a.gguf", "b.gguf")
    put(tmp_path, "copying.gguf", data=b"GGU")  # a copy that has barely begun
    put(tmp_path, "empty.gguf", data=b"")
    put(tmp_path, "mmproj-zzz.gguf", data=PROJECTOR)  # fits neither a nor b by name
    with caplog.at_level(logging.WARNING, "corral.models_dir"):
        cfg = parse('[server]\nmodels_dir = "."\n', tmp_path)
    assert sorted(cfg.models) == ["a", "b"]
    assert cfg.models["a"].mmproj is None and cfg.models["b"].mmproj is None
    warned = caplog.text
    assert "copying.gguf: not a GGUF model file" in warned and "empty.gguf: not a GGUF model file" in warned
    assert "mmproj-zzz.gguf: a multimodal projector that fits no one model" in warned


def test_the_one_projector_beside_the_one_model_is_its_mmproj(tmp_path: Path) -> None:
    # llama-server's router mode: a model's mmproj*.gguf lies beside it.
    put(tmp_path, "gemma-3-4b-it-Q4_K_M.gguf")
    put(tmp_path, "mmproj-model-f16.gguf", data=PROJECTOR)
    cfg = parse('[server]\nmodels_dir = "."\n', tmp_path)
    assert list(cfg.models) == ["gemma-3-4b-it-Q4_K_M"]
    assert cfg.models["gemma-3-4b-it-Q4_K_M"].mmproj == str(tmp_path / "mmproj-model-f16.gguf")


def test_projectors_pair_with_models_by_name_and_a_table_of_its_own_wins(tmp_path: Path) -> None:
    put(tmp_path, "gemma-3-4b-it-Q4_K_M.gguf", "qwen2.5-7b-Q4_K_M.gguf", "other.gguf")
    put(tmp_path, "mmproj-gemma-3-4b-it-f16.gguf", "qwen2.5-7b-mmproj-f16.gguf", data=PROJECTOR)
    put(tmp_path / "elsewhere", "mine.gguf", data=PROJECTOR)
    cfg = parse(
        '[server]\nmodels_dir = "."\n[models.\"qwen2.5-7b-Q4_K_M\"]\nmmproj = "elsewhere/mine.gguf"\n', tmp_path
    )
    assert cfg.models["gemma-3-4b-it-Q4_K_M"].mmproj == str(tmp_path / "mmproj-gemma-3-4b-it-f16.gguf")
    assert cfg.models["qwen2.5-7b-Q4_K_M"].mmproj == str(tmp_path / "elsewhere" / "mine.gguf")
    assert cfg.models["other"].mmproj is None


def test_pairing_is_pure_and_refuses_a_tie() -> None:
    assert pair_projectors(["mmproj-x.gguf"], ["only"]) == ({"only": "mmproj-x.gguf"}, [])
    # Two models share the projector's name as far: neither gets it.
    assert pair_projectors(["mmproj-llava-7b.gguf"], ["llava-7b-q4", "llava-7b-q8"]) == ({}, ["mmproj-llava-7b.gguf"])
    assert pair_projectors(["mmproj-llava-7b.gguf", "mmproj-gemma.gguf"], ["llava-7b-q4", "gemma-3", "x"]) == (
        {"llava-7b-q4": "mmproj-llava-7b.gguf", "gemma-3": "mmproj-gemma.gguf"}, []
    )


def test_a_folder_per_model_is_that_model_with_its_projector(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # llama-server's router layout (tools/server/README.md, "--models-dir"; common/preset.cpp
    # load_from_models_dir): a multimodal or split model in a folder of its own, named
    # after the folder.
    put(tmp_path / "gemma-3-4b-it", "gemma-3-4b-it-Q8_0.gguf")
    put(tmp_path / "gemma-3-4b-it", "mmproj-F16.gguf", data=PROJECTOR)
    put(tmp_path / "kimi", "kimi-00001-of-00002.gguf", "kimi-00002-of-00002.gguf")
    put(tmp_path / "old", "a.gguf", "b.gguf")  # several models: not a folder per model
    put(tmp_path / "two-projectors", "m.gguf")
    put(tmp_path / "two-projectors", "mmproj-a.gguf", "mmproj-b.gguf", data=PROJECTOR)
    put(tmp_path / "models--org--name" / "snapshots" / "abc", "deep.gguf")  # never read
    put(tmp_path / ".hidden", "h.gguf")
    put(tmp_path / "only-projector", "mmproj.gguf", data=PROJECTOR)
    put(tmp_path, "top.gguf")
    with caplog.at_level(logging.WARNING, "corral.models_dir"):
        cfg = parse('[server]\nmodels_dir = "."\n', tmp_path)
    assert sorted(cfg.models) == ["gemma-3-4b-it", "kimi", "top", "two-projectors"]
    assert cfg.models["gemma-3-4b-it"].path == tmp_path / "gemma-3-4b-it" / "gemma-3-4b-it-Q8_0.gguf"
    assert cfg.models["gemma-3-4b-it"].mmproj == str(tmp_path / "gemma-3-4b-it" / "mmproj-F16.gguf")
    assert cfg.models["kimi"].path == tmp_path / "kimi" / "kimi-00001-of-00002.gguf"
    assert cfg.models["two-projectors"].mmproj is None and cfg.models["top"].mmproj is None
    assert "old/: 2 models in one folder" in caplog.text
    assert "two-projectors/: 2 multimodal projectors" in caplog.text


def test_a_folder_per_model_may_not_clash_with_a_file_and_waits_for_its_copy(tmp_path: Path) -> None:
    found = scan([Entry("a.gguf")], {"a": [Entry("a/x.gguf")], "b": [Entry("b/y.gguf", "not a GGUF model file")]})
    assert found.models == {"a": "a.gguf"} and found.problems == ["a/: would be model 'a' too; rename the folder or the file"]
    assert found.not_ready == {"b": ("b/y.gguf", "b/y.gguf: not a GGUF model file")}
    # A broken split set inside a folder is a problem naming its file, as beside.
    found = scan([], {"s": [Entry("s/s-00001-of-00002.gguf")]})
    assert found.problems == ["s/s-00001-of-00002.gguf: split set lacks part(s) 00002 of 00002"]
    assert scan([], {"x": [Entry("x/.partial.gguf")]}).models == {}  # hidden: a copy in progress


def test_fingerprint_sees_a_folder_per_model(tmp_path: Path) -> None:
    put(tmp_path / "m", "m.gguf")
    before = fingerprint(tmp_path)
    assert [name for name, _, _ in before] == ["m/m.gguf"]
    put(tmp_path / "m", "mmproj.gguf", data=PROJECTOR)
    assert fingerprint(tmp_path) != before


def test_links_are_followed_and_a_broken_one_is_passed_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    put(tmp_path / "elsewhere", "real.gguf")
    put(tmp_path / "models", "a.gguf")
    (tmp_path / "models" / "linked.gguf").symlink_to(tmp_path / "elsewhere" / "real.gguf")
    (tmp_path / "models" / "gone.gguf").symlink_to(tmp_path / "elsewhere" / "deleted.gguf")
    (tmp_path / "models" / "dir.gguf").mkdir()  # a folder with a model's name is not one
    with caplog.at_level(logging.WARNING, "corral.models_dir"):
        cfg = parse('[server]\nmodels_dir = "models"\n', tmp_path)
    assert sorted(cfg.models) == ["a", "linked"]
    assert cfg.models["linked"].path == tmp_path / "elsewhere" / "real.gguf"  # resolved, as table paths are
    assert "gone.gguf: a broken symbolic link" in caplog.text


def test_a_table_whose_file_is_half_written_fails_that_model_saying_so(tmp_path: Path) -> None:
    # The table asks for the model by name: leaving it out silently would be wrong, and
    # "path: required key is missing" would send the operator looking in the wrong place.
    # It fails alone: the folder's other models are served (issue 20).
    put(tmp_path, "a.gguf", data=b"GG")
    put(tmp_path, "b.gguf")
    cfg = parse('[server]\nmodels_dir = "."\n[models.a]\nn_ctx = 512\n', tmp_path)
    assert sorted(cfg.models) == ["a", "b"]
    want = {"a": f"models.a.path: {tmp_path / 'a.gguf'}: not a GGUF model file (no GGUF magic)"}
    assert cfg.unloadable == want
    # An explicit path is checked the same way.
    assert parse('[server]\nmodels_dir = "."\n[models.a]\npath = "a.gguf"\n', tmp_path).unloadable == want


def test_the_command_line_folder_needs_no_file_and_wins_over_the_files(tmp_path: Path) -> None:
    put(tmp_path / "cli", "x.gguf")
    put(tmp_path / "file", "y.gguf")
    cfg = without_file({"models_dir": str(tmp_path / "cli"), "port": 0}, base_dir=tmp_path)
    assert list(cfg.models) == ["x"] and cfg.server.port == 0 and cfg.source is None
    cfg = parse('[server]\nmodels_dir = "file"\n', tmp_path, server_overrides={"models_dir": str(tmp_path / "cli")})
    assert list(cfg.models) == ["x"]


def test_fingerprint_changes_while_a_file_grows(tmp_path: Path) -> None:
    put(tmp_path, "a.gguf")
    (tmp_path / "notes.txt").write_text("x")
    before = fingerprint(tmp_path)
    assert [name for name, _, _ in before] == ["a.gguf"]
    with open(tmp_path / "a.gguf", "ab") as f:
        f.write(b"\0" * 10)
    assert fingerprint(tmp_path) != before
    assert fingerprint(tmp_path / "nowhere") == ()


def test_find_or_none_is_none_only_where_nothing_was_named_or_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"HOME": str(tmp_path)}
    assert config_search.find_or_none(None, env) is None
    with pytest.raises(ConfigError, match="CORRAL_CONFIG names"):
        config_search.find_or_none(None, {**env, "CORRAL_CONFIG": str(tmp_path / "missing.toml")})
    (tmp_path / "corral.toml").write_text("")
    assert config_search.find_or_none(None, env) == (Path("corral.toml"), "the first of the search path")
