"""A model option travels from the config to the worker without being copied by hand
(issue 9, item 2): ModelConfig, ModelSpec and WorkerSpec inherit worker.protocol's
ModelOptions, and worker_spec() copies whatever fields it has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from supervisor.config import ModelConfig, ModelSpec, parse
from supervisor.config.schema import UPSTREAM_KEYS, GenerationDefaults
from supervisor.launcher import worker_spec
from worker.protocol import ModelOptions, WorkerSpec, options_of
from tests.harness import write_gguf

# The keys of a [models.NAME] table that only the supervisor acts on. A new key that the
# worker needs belongs in ModelOptions instead, where it reaches the worker by itself.
# `instances` too: the supervisor runs that many workers, each told its own spec, and a
# change of it restarts none of them (issue 43).
SUPERVISOR_ONLY = {
    "path", "aliases", "tags", "idle_timeout", "preload", "pinned", "instances", "max_queue", "queue_timeout",
    "base",  # an adapter model's: it has no worker of its own (supervisor/config/lora.py)
} | (
    set(GenerationDefaults.__struct_fields__) - set(ModelOptions.__struct_fields__)  # the router applies these
) | set(UPSTREAM_KEYS)  # the router's relay reads these, from Config.upstreams


def fields(cls: type[msgspec.Struct]) -> set[str]:
    return set(cls.__struct_fields__)


def test_every_config_key_but_the_supervisors_reaches_the_worker() -> None:
    """Fails when an option is added to ModelConfig itself rather than to ModelOptions:
    the config would accept it and the worker would never hear of it."""
    not_carried = fields(ModelConfig) - SUPERVISOR_ONLY - fields(WorkerSpec)
    assert not not_carried, f"add {sorted(not_carried)} to worker.protocol.ModelOptions"
    assert fields(ModelConfig) - SUPERVISOR_ONLY == fields(ModelOptions)
    # The resolved spec has every key of the table but the upstream ones (UpstreamSpec's)
    # and an adapter model's `base` (Config.lora's), plus the model's name.
    assert fields(ModelSpec) == fields(ModelConfig) - set(UPSTREAM_KEYS) - {"base"} | {"name"}


def spec_with(**options: Any) -> ModelSpec:
    return ModelSpec(
        name="m", path=Path("/models/m.gguf"), aliases=(), idle_timeout=600.0, **options
    )


def test_worker_spec_carries_every_option_as_it_is() -> None:
    # A distinct object per option: a field that is dropped, defaulted or swapped with
    # another on the way shows up as the wrong object, whatever its type.
    sent = {name: object() for name in ModelOptions.__struct_fields__}
    ws = worker_spec(spec_with(**sent))
    assert (ws.name, ws.path) == ("m", "/models/m.gguf")
    got = options_of(ws)
    assert {name: got[name] is sent[name] for name in sent} == {name: True for name in sent}


def test_worker_spec_threads_override_only_threads() -> None:
    spec = spec_with(threads=2, n_ctx=1024)
    assert worker_spec(spec).threads == 2
    given = worker_spec(spec, threads=5)
    assert given.threads == 5
    assert msgspec.structs.replace(given, threads=2) == worker_spec(spec)


def test_worker_spec_from_a_config_survives_the_command_line(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf")
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    cfg = parse(
        '[models.m]\npath = "m.gguf"\nslots = 2\nn_ctx = 512\nchat_template = "t.jinja"\n'
        'embeddings = true\npooling = "cls"\nrepack = true\nswa_full = false\npinned = true\n',
        tmp_path,
    )
    ws = worker_spec(cfg.models["m"], threads=3)
    data = msgspec.json.encode(ws)
    # The name leads the JSON, so that even a `ps` line cut at the terminal's width shows
    # which model a worker serves.
    assert data.startswith(b'{"name":"m","path":')
    assert msgspec.json.decode(data, type=WorkerSpec) == ws
    assert ws == WorkerSpec(
        name="m",
        path=str(tmp_path / "m.gguf"),
        slots=2,
        n_ctx=512,
        threads=3,
        chat_template=str(tmp_path / "t.jinja"),
        embeddings=True,
        pooling="cls",
        repack=True,
        swa_full=False,
    )
