"""llama-server's command line, read as llama-server reads it, and turned into a Corral config.

llama.cpp's own server tests start `llama-server` with flags (`ServerProcess.start` in the utils.py of tools/server/tests),
The peer harness puts a small launcher in its place that reads those
flags and serves the same thing with Corral, so that the suite runs unchanged against
Corral. Models named by Hugging Face repository (`--hf-repo`) cannot be downloaded here:
every one is served from one local GGUF, the same one the llama-server baseline gets, so
that both servers answer with the same model.

Pure: argv in, a config dict out. No I/O.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ServerFlags:
    """The flags of one llama-server start that matter to how it serves."""

    host: str = "127.0.0.1"
    port: int = 8080
    model: str | None = None  # --model, or the local stand-in for --hf-repo / --hf-file
    alias: str | None = None
    tags: str | None = None
    n_ctx: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    parallel: int | None = None
    threads: int | None = None
    temperature: float | None = None
    seed: int | None = None
    n_predict: int | None = None
    embeddings: bool = False
    reranking: bool = False
    pooling: str | None = None
    metrics: bool = False
    slots: bool = True
    api_key: str | None = None
    cors_origins: str | None = None
    jinja: bool = True
    chat_template: str | None = None
    chat_template_file: str | None = None
    reasoning_format: str | None = None
    models_dir: str | None = None
    models_max: int | None = None
    models_preset: str | None = None
    models_autoload: bool = True
    sleep_idle_seconds: float | None = None
    kv_unified: bool = False
    reasoning: str | None = None
    verbose: bool = False
    # --lora FILE (scale 1) and --lora-scaled FILE:SCALE, in order; with
    # --lora-init-without-apply, every one at 0 until a request or POST /lora-adapters.
    lora: tuple[tuple[str, float], ...] = ()
    server_tools: str | None = None
    ignored: tuple[str, ...] = field(default=())


# Flags that take a value and change nothing Corral can act on (speculative decoding, LoRA,
# KV cache types, group attention, ...): read so that their value is not taken for a flag.
_IGNORED_WITH_VALUE = (
    "--model-url", "--model-draft", "--ubatch-size", "--n-gpu-layers", "-ctk", "-ctv", "-fa",
    "--slot-save-path", "--grp-attn-n", "--grp-attn-w", "--spec-type",
    "--spec-draft-n-max", "--spec-draft-n-min", "--spec-synth-len", "--spec-synth-rates",
    "--mmproj-url", "--media-path", "--cache-ram", "--tools-runtime",
    "--mcp-servers-config", "--mcp-servers-json", "--log-file",
)
_IGNORED_SWITCHES = (
    "--offline", "--cont-batching", "--swa-full",
    "--context-shift", "--no-ui", "--no-mmproj", "--no-cache-idle-slots", "--ui-mcp-proxy",
    "--backend_sampling",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llama-server", add_help=False, allow_abbrev=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--model", "-m")
    p.add_argument("--hf-repo", "-hf")
    p.add_argument("--hf-file", "-hff")
    p.add_argument("--alias", "-a")
    p.add_argument("--tags")
    p.add_argument("--ctx-size", "-c", type=int)
    p.add_argument("--batch-size", "-b", type=int)
    p.add_argument("--parallel", "-np", type=int)
    p.add_argument("--threads", "-t", type=int)
    p.add_argument("--temp", type=float)
    p.add_argument("--seed", "-s", type=int)
    p.add_argument("--n-predict", "-n", type=int)
    p.add_argument("--embedding", "--embeddings", action="store_true")
    p.add_argument("--reranking", "--rerank", action="store_true")
    p.add_argument("--pooling")
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--slots", dest="slots", action="store_true", default=True)
    p.add_argument("--no-slots", dest="slots", action="store_false")
    p.add_argument("--api-key")
    p.add_argument("--cors-origins")
    p.add_argument("--jinja", dest="jinja", action="store_true", default=True)
    p.add_argument("--no-jinja", dest="jinja", action="store_false")
    p.add_argument("--chat-template")
    p.add_argument("--chat-template-file")
    p.add_argument("--reasoning-format")
    p.add_argument("--models-dir")
    p.add_argument("--models-max", type=int)
    p.add_argument("--models-preset")
    p.add_argument("--no-models-autoload", action="store_true")
    p.add_argument("--sleep-idle-seconds", type=float)
    p.add_argument("--kv-unified", "-kvu", action="store_true")
    p.add_argument("--reasoning", "-rea")
    p.add_argument("--verbose", "-v", action="store_true")
    p.add_argument("--tools")
    p.add_argument("--lora", action="append", default=[])
    p.add_argument("--lora-scaled", action="append", default=[])
    p.add_argument("--lora-init-without-apply", action="store_true")
    for flag in _IGNORED_WITH_VALUE:
        p.add_argument(flag, dest="ignored_" + flag.strip("-").replace("-", "_"), action="append")
    for flag in _IGNORED_SWITCHES:
        p.add_argument(flag, dest="ignored_" + flag.strip("-").replace("-", "_"), action="store_true")
    return p


def read_flags(argv: list[str], local_model: str) -> ServerFlags:
    """llama-server's `argv` (without the program); a model given by Hugging Face name is
    `local_model`. Unknown flags raise SystemExit, as llama-server refuses them."""
    a = _parser().parse_args(argv)
    model = a.model
    if model is None and (a.hf_repo or a.hf_file):
        model = local_model
    ignored = tuple(
        k.removeprefix("ignored_") for k, v in vars(a).items() if k.startswith("ignored_") and v
    )
    lora = [(f, 1.0) for arg in a.lora for f in arg.split(",") if f]
    for arg in a.lora_scaled:
        for item in arg.split(","):
            path, _, scale = item.rpartition(":")
            lora.append((path, float(scale)))
    if a.lora_init_without_apply:
        lora = [(path, 0.0) for path, _ in lora]
    return ServerFlags(
        host=a.host, port=a.port, model=model, alias=a.alias, tags=a.tags, n_ctx=a.ctx_size,
        n_batch=a.batch_size, parallel=a.parallel, threads=a.threads, temperature=a.temp,
        seed=a.seed, n_predict=a.n_predict, embeddings=a.embedding, reranking=a.reranking,
        pooling=a.pooling, metrics=a.metrics, slots=a.slots, api_key=a.api_key,
        cors_origins=a.cors_origins, jinja=a.jinja, chat_template=a.chat_template,
        chat_template_file=a.chat_template_file, reasoning_format=a.reasoning_format,
        models_dir=a.models_dir, models_max=a.models_max, models_preset=a.models_preset,
        models_autoload=not a.no_models_autoload, sleep_idle_seconds=a.sleep_idle_seconds,
        kv_unified=a.kv_unified, reasoning=a.reasoning, verbose=a.verbose, server_tools=a.tools,
        lora=tuple(lora), ignored=ignored,
    )


def hf_to_local(argv: list[str], local_model: str) -> list[str]:
    """`argv` with `--hf-repo`/`--hf-file` replaced by `--model local_model`, for the
    llama-server baseline, which must serve the same model as Corral does."""
    out: list[str] = []
    replaced = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--hf-repo", "-hf", "--hf-file", "-hff"):
            i += 2
            if not replaced and "--model" not in argv and "-m" not in argv:
                out += ["--model", local_model]
                replaced = True
            continue
        if arg == "--offline":
            i += 1
            continue
        out.append(arg)
        i += 1
    return out


# llama-server's defaults where they differ from Corral's: its context is 4096 tokens
# unless the model's training context is smaller, split among --parallel slots.
_LLAMA_N_CTX = 4096
_LLAMA_SLOTS = 4


def corral_config(f: ServerFlags, model_has_template: bool = False, router_folder: str = "") -> dict[str, Any]:
    """The Corral config that serves what llama-server would with flags `f`;
    `model_has_template`: the GGUF carries a chat template of its own; `router_folder`:
    the models of router mode when the flags name no folder."""
    hosts = [h.strip() for h in f.host.split(",") if h.strip()]
    server: dict[str, Any] = {"host": hosts[0] if len(hosts) == 1 else hosts, "port": f.port}
    if f.api_key:
        server["api_keys"] = [f.api_key]
    # llama-server allows every origin unless told otherwise (or unless it runs tools, then
    # loopback pages only: common/arg.cpp); Corral none.
    origins = f.cors_origins if f.cors_origins is not None else "localhost" if f.server_tools else "*"
    server["cors_origins"] = [o.strip() for o in origins.split(",") if o.strip()]
    if f.models_dir:
        server["models_dir"] = f.models_dir
    server["slots_endpoint"] = f.slots
    server["v1_error_shape"] = "llama-server"
    server["verbose_responses"] = f.verbose
    server["models_autoload"] = f.models_autoload
    # llama-server's models stay loaded unless --sleep-idle-seconds; tests time nothing
    # around a lazy load.
    idle = f.sleep_idle_seconds if f.sleep_idle_seconds and f.sleep_idle_seconds > 0 else 0
    config: dict[str, Any] = {
        "server": server,
        "supervisor": {"idle_timeout": idle, "start_timeout": 120},
        "models": {},
    }
    if f.models_max:
        config["supervisor"]["max_loaded_models"] = f.models_max
    if f.model is None:
        # Router mode: llama-server serves what its cache and --models-dir hold; Corral
        # needs a folder with something in it (the launcher gives it the stand-in GGUF).
        server.setdefault("models_dir", router_folder)
        return config
    model: dict[str, Any] = {"path": f.model, "preload": True}
    slots = f.parallel or _LLAMA_SLOTS
    model["slots"] = slots
    model["n_ctx"] = n_ctx = f.n_ctx or _LLAMA_N_CTX
    if not f.kv_unified and slots > 1:
        # Without --kv-unified, llama-server gives each slot an equal share.
        model["n_ctx_slot"] = n_ctx // slots
    if f.n_batch:
        model["n_batch"] = f.n_batch
    if f.threads:
        model["threads"] = f.threads
    if f.embeddings or f.reranking:
        model["embeddings"] = True
    if f.pooling:
        model["pooling"] = f.pooling
    elif f.reranking:
        model["pooling"] = "rank"
    if f.chat_template_file:
        model["chat_template"] = f.chat_template_file
    elif f.chat_template:
        model["chat_template"] = f.chat_template
    elif not model_has_template:
        # llama-server falls back to ChatML for a model without a template; Corral asks
        # for one in the config instead, so the launcher says it.
        model["chat_template"] = "chatml"
    if f.reasoning in ("on", "off"):  # llama-server's default template variable for each
        model["chat_template_kwargs"] = {"enable_thinking": f.reasoning == "on"}
    if f.lora:
        model["lora"] = [{"path": path, "scale": scale} for path, scale in f.lora]
    if f.n_predict is not None:
        model["n_predict"] = f.n_predict
    if f.temperature is not None:
        model["temperature"] = f.temperature
    if f.seed is not None:
        model["seed"] = f.seed
    # --alias a,b,c: every one is a name; the id is the first in sorted order (a std::set).
    names = sorted({a.strip() for a in (f.alias or "").split(",") if a.strip()})
    name = names[0] if names else f.model.rsplit("/", 1)[-1]
    if names[1:]:
        model["aliases"] = names[1:]
    if f.tags:
        model["tags"] = [t.strip() for t in f.tags.split(",") if t.strip()]
    config["models"][name] = model
    server["default_model"] = name
    server["unknown_model"] = "default"  # llama-server serving one model ignores the name
    return config
