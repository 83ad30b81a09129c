"""The peer launcher's reading of llama-server's command line (tests/peer/llama_flags.py):
each flag the suite passes (its utils.py, ServerProcess.start) becomes the Corral config
that serves the same, and the config it writes is one Corral accepts."""

from __future__ import annotations

from pathlib import Path

import tomlkit

from supervisor.config import parse
from tests.harness import write_gguf
from tests.peer.launch_corral import is_download, preset_models
from tests.peer.llama_flags import corral_config, hf_to_local, read_flags

# What the suite's tinyllama2 preset starts, with --slots and an API key.
ARGV = [
    "--port", "8123", "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1,::1", "--offline",
    "--hf-repo", "ggml-org/test-model-stories260K", "--batch-size", "32", "--slots", "--alias", "tinyllama-2,fim,code",
    "--tags", "chat,small", "--ctx-size", "512", "--parallel", "2", "--n-predict", "64", "--no-jinja",
    "--api-key", "sk-test-key-1", "--reasoning", "off", "-fa", "on",
]


def test_flags_become_the_config_that_serves_the_same(tmp_path: Path) -> None:
    model = write_gguf(tmp_path / "m.gguf")
    f = read_flags(ARGV, str(model))
    config = corral_config(f, model_has_template=False, router_folder=str(tmp_path))
    server = config["server"]
    ((name, m),) = config["models"].items()
    assert server["host"] == ["127.0.0.1", "::1"] and server["port"] == 8123 and server["api_keys"] == ["sk-test-key-1"]
    assert server["cors_origins"] == ["*"] and server["slots_endpoint"] is True
    assert server["unknown_model"] == "default" and server["v1_error_shape"] == "llama-server"
    assert name == "code" and m["aliases"] == ["fim", "tinyllama-2"] and m["tags"] == ["chat", "small"]
    assert (m["slots"], m["n_ctx"], m["n_ctx_slot"], m["n_batch"]) == (2, 512, 256, 32)
    assert (m["temperature"], m["seed"], m["n_predict"]) == (0.8, 42, 64)
    assert m["chat_template"] == "chatml"  # llama-server's fallback for a GGUF without one
    assert m["chat_template_kwargs"] == {"enable_thinking": False}
    assert "fa" in f.ignored and m["path"] == str(model)
    # The written config is one Corral takes (the host list needs the key it has).
    cfg = parse(tomlkit.dumps(config), tmp_path)
    assert cfg.models["code"].defaults.seed == 42


def test_router_mode_and_the_baseline_rewrite(tmp_path: Path) -> None:
    f = read_flags(["--port", "8080", "--models-max", "2", "--tools", "all"], "/m.gguf")
    config = corral_config(f, router_folder=str(tmp_path))
    assert config["models"] == {} and config["server"]["models_dir"] == str(tmp_path)
    assert config["supervisor"]["max_loaded_models"] == 2
    assert config["server"]["cors_origins"] == ["localhost"]  # llama-server's default with tools
    assert hf_to_local(["--hf-repo", "a/b", "--hf-file", "c.gguf", "--offline", "--port", "1"], "/m.gguf") == [
        "--model", "/m.gguf", "--port", "1",
    ]
    embed = corral_config(read_flags(["--model", "/m.gguf", "--reranking"], "/x"))
    (m,) = embed["models"].values()
    assert m["embeddings"] is True and m["pooling"] == "rank"


UTILS = '''
class ServerProcess:
    model_hf_repo: str | None = "ggml-org/models"
    model_hf_file: str | None = "tinyllamas/stories260K.gguf"
    offline: bool = False

class ServerPreset:
    @staticmethod
    def load_all() -> None:
        pass

    @staticmethod
    def tinyllama2() -> ServerProcess:
        server = ServerProcess()
        server.offline = True
        server.model_hf_repo = "ggml-org/test-model-stories260K"
        server.model_hf_file = None
        return server

    @staticmethod
    def keeps_defaults() -> ServerProcess:
        server = ServerProcess()
        server.offline = True
        return server

    @staticmethod
    def router() -> ServerProcess:
        server = ServerProcess()
        server.model_hf_repo = None
        server.model_hf_file = None
        return server
'''


def test_only_the_suites_download_starts_get_the_stand_in(tmp_path: Path) -> None:
    """load_all's start of a preset (its repository and file, no --offline) is stood in
    for; the same preset started by a test (--offline), a test's own model without
    --offline (test_load_split_model) and a router start are served by Corral."""
    (tmp_path / "utils.py").write_text(UTILS)
    assert preset_models(tmp_path / "utils.py") == {
        ("ggml-org/test-model-stories260K", None), ("ggml-org/models", "tinyllamas/stories260K.gguf"),
    }
    stories = ["--port", "8080", "--hf-repo", "ggml-org/test-model-stories260K"]
    assert is_download(stories, tmp_path)
    assert not is_download([*stories, "--offline"], tmp_path)
    assert is_download(["--hf-repo", "ggml-org/models", "--hf-file", "tinyllamas/stories260K.gguf"], tmp_path)
    split = ["--hf-repo", "ggml-org/models", "--hf-file", "tinyllamas/split/stories15M-q8_0-00001-of-00003.gguf"]
    assert not is_download(split, tmp_path)
    assert not is_download(["--port", "8080", "--models-dir", "x"], tmp_path)


def test_lora_flags_become_the_models_adapters() -> None:
    """ServerProcess.start passes each of `lora_files` as `--lora FILE` (the suite's
    utils.py); llama-server also takes --lora-scaled FILE:SCALE and
    --lora-init-without-apply (common/arg.cpp)."""
    f = read_flags(["-m", "m.gguf", "--lora", "a.gguf", "--lora-scaled", "b.gguf:0.5,c.gguf:2"], "local.gguf")
    assert f.lora == (("a.gguf", 1.0), ("b.gguf", 0.5), ("c.gguf", 2.0))
    model = next(iter(corral_config(f)["models"].values()))
    assert model["lora"] == [{"path": "a.gguf", "scale": 1.0}, {"path": "b.gguf", "scale": 0.5}, {"path": "c.gguf", "scale": 2.0}]
    quiet = read_flags(["-m", "m.gguf", "--lora", "a.gguf", "--lora-init-without-apply"], "local.gguf")
    assert quiet.lora == (("a.gguf", 0.0),) and "lora" not in quiet.ignored
