"""llama-server's models preset INI, as `corral config import-preset` translates it
(issue 22, item 7): the example of llama-server's README ("Model presets"), then the edges."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from supervisor.config import parse
from supervisor.config.presets import PresetError, import_preset
from tests.harness import write_gguf

# llama-server's README's example, with a model file of ours in the custom section.
PRESET = """version = 1

; (Optional) This section provides global settings shared across all presets.
[*]
c = 8192
n-gpu-layers = 8

[ggml-org/MY-MODEL-GGUF:Q8_0]
chat-template = chatml
n-gpu-layers = 123
jinja = true
c = 4096
LLAMA_ARG_CACHE_RAM = 0
hf-repo = ggml-org/MY-MODEL-GGUF

[custom_model]
model = {MODEL}
alias = cm,custom
temp = 0.5
reasoning = off
load-on-startup = true
reranking = false
"""


def test_the_readmes_example_becomes_a_config_corral_takes(tmp_path: Path) -> None:
    model = write_gguf(tmp_path / "m.gguf")
    text = import_preset(PRESET.replace("{MODEL}", str(model)), "my-models.ini")
    data = tomllib.loads(text)
    assert data["model_defaults"] == {"n_ctx": 8192, "n_gpu_layers": 8}
    hf = data["models"]["ggml-org/MY-MODEL-GGUF:Q8_0"]
    assert hf == {"chat_template": "chatml", "n_gpu_layers": 123, "n_ctx": 4096}
    custom = data["models"]["custom_model"]
    assert custom["path"] == str(model) and custom["aliases"] == ["cm", "custom"]
    assert (custom["temperature"], custom["preload"]) == (0.5, True)
    assert custom["chat_template_kwargs"] == {"enable_thinking": False}
    # Every key says where it came from; what Corral cannot use is said, not dropped.
    assert "n_ctx = 4096 # c = 4096 (my-models.ini:12)" in text
    assert "not translated: LLAMA_ARG_CACHE_RAM = 0 (my-models.ini:13)" in text
    assert "hf-repo = ggml-org/MY-MODEL-GGUF (my-models.ini:14): Corral downloads nothing" in text
    # The model that names a file is served as written; the one that names a repository
    # needs its path (the config check says so).
    del data["models"]["ggml-org/MY-MODEL-GGUF:Q8_0"]
    only_file = text.split('[models."ggml-org/MY-MODEL-GGUF:Q8_0"]')[0] + "[models.custom_model]" + text.split("[models.custom_model]")[1]
    cfg = parse(only_file, tmp_path)
    assert cfg.models["custom_model"].defaults.temperature == 0.5 and cfg.models["custom_model"].n_ctx == 8192


@pytest.mark.parametrize(
    ("ini", "problem"),
    [
        ("[a]\nc = lots\n", "c = lots"),
        ("[a]\nembedding = maybe\n", "embedding = maybe"),
        ("[a\nc = 1\n", "p.ini"),
    ],
)
def test_a_preset_corral_cannot_read_says_where(ini: str, problem: str) -> None:
    with pytest.raises(PresetError) as info:
        import_preset(ini, "p.ini")
    assert problem in str(info.value)


def test_per_model_keys_in_the_global_section_stay_comments() -> None:
    text = import_preset("[*]\nmodel = /x.gguf\nc = 2048\n", "p.ini")
    assert tomllib.loads(text)["model_defaults"] == {"n_ctx": 2048}
    assert "not translated: model = /x.gguf (p.ini:2): set per model" in text


def test_speculation_and_the_host_prompt_cache_translate(tmp_path: Path) -> None:
    """llama-server's --spec-type (its n-gram kinds are Corral's "ngram"),
    --spec-draft-n-max and --cache-ram (MiB; -1 no limit) (issue 24)."""
    model = write_gguf(tmp_path / "m.gguf")
    ini = f"[a]\nmodel = {model}\nspec-type = ngram-simple\nspec-draft-n-max = 24\ncache-ram = 512\n"
    data = tomllib.loads(import_preset(ini, "p.ini"))["models"]["a"]
    assert (data["spec_type"], data["draft_max"], data["prompt_cache_bytes"]) == ("ngram", 24, 512 << 20)
    draft = f"[a]\nmodel = {model}\nmd = {model}\nspec-type = draft-simple\ndraft-p-min = 0.6\n"
    data = tomllib.loads(import_preset(draft, "p.ini"))["models"]["a"]
    assert (data["spec_type"], data["draft_model"], data["draft_p_min"]) == ("draft", str(model), 0.6)
    off = tomllib.loads(import_preset(f"[a]\nmodel = {model}\nspec-type = none\ncache-ram = 0\n", "p.ini"))["models"]["a"]
    assert (off["spec_type"], off["prompt_cache_bytes"]) == ("none", 0)


def test_every_sampling_key_of_a_preset_is_one_the_config_takes(tmp_path: Path) -> None:
    """Each of llama-server's sampling flags that the importer writes must be a model key
    the config reads: `repeat-last-n` was written as `repeat_last_n`, which the config
    refused as an unknown key, and no request route then read a model's own value."""
    model = write_gguf(tmp_path / "m.gguf")
    ini = (
        f"[a]\nmodel = {model}\ntemp = 0.3\ntop-k = 7\ntop-p = 0.5\nmin-p = 0.02\nrepeat-penalty = 1.2\n"
        "repeat-last-n = 32\npresence-penalty = 0.1\nfrequency-penalty = 0.2\nseed = 9\nreverse-prompt = END\n"
    )
    defaults = parse(import_preset(ini, "p.ini"), tmp_path).models["a"].defaults
    assert (defaults.temperature, defaults.top_k, defaults.top_p, defaults.min_p) == (0.3, 7, 0.5, 0.02)
    assert (defaults.repeat_penalty, defaults.repeat_last_n, defaults.seed, defaults.stop) == (1.2, 32, 9, ["END"])
    assert (defaults.presence_penalty, defaults.frequency_penalty) == (0.1, 0.2)
    with pytest.raises(Exception, match="repeat_last_n"):
        parse(f'[models.a]\npath = "{model}"\nrepeat_last_n = -2\n', tmp_path)
