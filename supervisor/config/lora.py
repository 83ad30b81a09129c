"""LoRA adapters in the config: checked against their base model, and the names they serve.

Two ways to serve an adapter, both on the base model's one worker and memory:
- on the model itself: `lora = [{ path, scale }]` in its table; requests to its name get
  the adapters at their scales (llama-server's --lora-scaled), unless they send their own
  `lora` or an operator set others (POST /lora-adapters);
- as a model name of its own (vLLM's way): a table with `base = "NAME"` and `lora`, and
  nothing of a worker's (the base's worker serves it), so that any OpenAI client picks a
  fine-tune by `model`; keys are scoped to it as to any model.

The base's worker loads its own adapters first, then each adapter model's, each file once
(`plan`); a name's `LoraView` maps the ids its requests use (0, 1, ... as its table lists
them) to that list. An adapter file is read in Python before any worker loads it
(`problem`): a GGUF of type adapter, for the base's architecture, whose every tensor pair
fits the base's weight of that name, as src/llama-adapter.cpp checks them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Mapping

from supervisor.config import gguf_meta
from supervisor.config.checks import resolve_path
from supervisor.config.key_paths import quote
from supervisor.config.lora_views import Adapter, LoraView
from supervisor.config.schema import ModelConfig
from supervisor.config.upstreams import set_keys
from worker.protocol.load_options import LoraAdapter

# What an adapter model's table may set: the rest is its base's, on the base's table.
ADAPTER_MODEL_KEYS = frozenset({"base", "lora", "aliases", "tags"})
MAX_ADAPTERS = 64  # per worker: each costs a graph node per adapted weight while applied


def problem(adapter: Path, model: Path) -> str | None:
    """Why `adapter` cannot load onto `model`, or None: llama.cpp's own checks, read from
    the two headers."""
    if (unloadable := gguf_meta.problem(adapter)) is not None:
        return str(unloadable)
    try:
        meta = gguf_meta.read_metadata(adapter)
        mine = gguf_meta.tensor_shapes(adapter)
        base_meta = gguf_meta.read_metadata(model, enough=lambda m: "general.architecture" in m)
        base = gguf_meta.tensor_shapes(model)
    except (OSError, gguf_meta.NotGGUF) as exc:
        return f"{adapter}: cannot be read ({exc})"
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        return f"{adapter}: not a LoRA adapter (general.type {meta.get('general.type')!r}, adapter.type {meta.get('adapter.type')!r})"
    if "adapter.alora.invocation_tokens" in meta:
        # llama-server applies one only after its invocation tokens; applied to the whole
        # prompt it would answer, silently, as another model.
        return f"{adapter}: an activated LoRA (aLoRA), which Corral does not serve"
    arch, base_arch = meta.get("general.architecture"), base_meta.get("general.architecture")
    if arch != base_arch:
        return f"{adapter}: an adapter for architecture {arch!r}, and the model is {base_arch!r}"
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, ne in mine.items():
        stem, _, part = name.rpartition(".")
        if part not in ("lora_a", "lora_b"):
            return f"{adapter}: tensor {name!r} is neither a lora_a nor a lora_b"
        pairs.setdefault(stem, {})[part] = ne
    if not pairs:
        return f"{adapter}: holds no lora_a/lora_b tensors"
    for stem, pair in sorted(pairs.items()):
        if len(pair) != 2:
            return f"{adapter}: tensor {stem!r} has only its {next(iter(pair))}"
        if stem not in base:
            return f"{adapter}: adapts {stem!r}, which the model has not (an adapter for another model?)"
        why = _shape_problem(stem, base[stem], pair["lora_a"], pair["lora_b"])
        if why is not None:
            return f"{adapter}: {why}"
    return None


def _shape_problem(stem: str, w: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> str | None:
    """llama-adapter.cpp's shape rule for weight `w` (ne [in, out]): A is [in, r], B is
    [r, out]; for token_embd A and B swap."""
    if len(w) != 2 or len(a) != 2 or len(b) != 2:
        return f"{stem}: LoRA pairs adapt 2-D weights only"
    if stem == "token_embd.weight":
        fits = w[0] == b[1] and w[1] == a[1]
    else:
        fits = w[0] == a[0] and w[1] == b[1] and a[1] == b[0]
    if not fits:
        return f"{stem}: lora_a {list(a)} and lora_b {list(b)} do not fit the model's {list(w)} (an adapter for another model?)"
    return None


def table_problems(at: str, m: ModelConfig, models: Mapping[str, ModelConfig], base_dir: Path) -> Iterator[str]:
    """What is wrong with a table's `lora` and `base`."""
    if not 1 <= m.lora_turn_steps <= 256:
        yield f"{at}.lora_turn_steps: must be 1..256, got {m.lora_turn_steps}"
    if len(m.lora) > MAX_ADAPTERS:
        yield f"{at}.lora: at most {MAX_ADAPTERS} adapters, got {len(m.lora)}"
    for i, a in enumerate(m.lora):
        if not -100.0 <= a.scale <= 100.0:  # NaN fails this too
            yield f"{at}.lora[{i}].scale: must be -100..100, got {a.scale}"
    if m.base is None:
        if m.lora and m.path is None:
            yield f"{at}.lora: adapters apply to a model served here (with `path`)"
        elif m.lora and m.embeddings:
            yield f"{at}.lora: an embedding model takes no adapters here"
        elif m.path is not None:
            model = resolve_path(m.path, base_dir)
            yield from _files(at, m.lora, model, base_dir)
        return
    base = models.get(m.base)
    if base is None:
        yield f"{at}.base: {m.base!r} is not a model in [models]"
        return
    if base.base is not None or base.path is None or base.embeddings:
        yield f"{at}.base: {m.base!r} must be a model served here (with `path`), not an embedding or adapter model"
        return
    for key in sorted(set(set_keys(m)) - ADAPTER_MODEL_KEYS):
        yield f"{at}.{key}: an adapter model is served by its base's worker; set it on models.{quote(m.base)}"
    if not m.lora:
        yield f"{at}.lora: an adapter model names at least one adapter"
    yield from _files(at, m.lora, resolve_path(base.path, base_dir), base_dir)


def _files(at: str, adapters: list[LoraAdapter], model: Path, base_dir: Path) -> Iterator[str]:
    if gguf_meta.problem(model) is not None:
        return  # said of the model's own path
    for i, a in enumerate(adapters):
        if (why := problem(resolve_path(a.path, base_dir), model)) is not None:
            yield f"{at}.lora[{i}].path: {why}"


def plan(models: Mapping[str, ModelConfig], base_dir: Path) -> tuple[dict[str, list[LoraAdapter]], dict[str, LoraView]]:
    """What each local model's worker loads (its own adapters, then its adapter models'),
    and every served name's view of them: each name with adapters, and each adapter model."""
    loads: dict[str, list[LoraAdapter]] = {}
    views: dict[str, LoraView] = {}
    owners = [(n, m) for n, m in models.items() if m.base is None and m.path is not None]
    owners += [(n, m) for n, m in models.items() if m.base is not None]
    for name, m in owners:
        model = name if m.base is None else m.base
        loaded = loads.setdefault(model, [])
        entries = []
        for a in m.lora:
            path = resolve_path(a.path, base_dir)
            index = next((i for i, b in enumerate(loaded) if b.path == str(path)), len(loaded))
            if index == len(loaded):
                # Scales are the router's (Config.lora): a changed one restarts no worker.
                loaded.append(LoraAdapter(path=str(path)))
            entries.append(Adapter(index, path, a.scale, *_labels(path)))
        if entries or m.base is not None:
            views[name] = LoraView(name, model, tuple(entries), tuple(m.aliases), tuple(m.tags))
    return loads, views


def _labels(path: Path) -> tuple[str, str]:
    """The adapter's task name and prompt prefix, where its header has them."""
    try:
        meta = gguf_meta.read_metadata(path)
    except (OSError, gguf_meta.NotGGUF):
        return "", ""
    task, prefix = meta.get("adapter.lora.task_name", ""), meta.get("adapter.lora.prompt_prefix", "")
    return (task if isinstance(task, str) else "", prefix if isinstance(prefix, str) else "")
