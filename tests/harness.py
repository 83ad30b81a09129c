"""Shared by the supervisor tests: configs written as TOML and parsed the way `corral serve`
does, and a supervisor running for the length of a block."""

from __future__ import annotations

import json
import os
import struct
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import trio

from supervisor.config import Config, ConfigError, parse
from supervisor.supervisor import Supervisor


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table (an api_keys entry)
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} as TOML")


def config_text(
    models: dict[str, dict[str, object]], server: dict[str, object] | None = None, **supervisor: object
) -> str:
    """TOML for a config whose models point at `dummy.gguf` unless they name their own
    `path` (relative to the config's folder)."""
    lines = ["[server]", *(f"{k} = {toml_value(v)}" for k, v in (server or {}).items())]
    lines += ["[supervisor]", *(f"{k} = {toml_value(v)}" for k, v in supervisor.items())]
    for name, fields in models.items():
        lines.append(f"[models.{json.dumps(name)}]")
        fields = {"path": "dummy.gguf", **fields}
        lines += [f"{k} = {toml_value(v)}" for k, v in fields.items()]
    return "\n".join(lines) + "\n"


def registry_cache(name: str) -> Path:
    """A folder of what the tests fetch from package registries (llama.cpp's server tests
    and their packages, the agent CLIs from npm), kept between runs and between checkouts,
    as pip keeps its wheels and npm its packages: $CORRAL_TEST_CACHE, else
    $XDG_CACHE_HOME/corral/tests, else ~/.cache/corral/tests. Each entry is named by what
    it pins, so that a checkout pinning another version gets its own."""
    root = os.environ.get("CORRAL_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "corral", "tests"
    )
    folder = Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_gguf(path: Path, size: int | None = None) -> Path:
    """The smallest whole GGUF file: a header with one key and no tensors. Enough for the
    config check, which reads every model's header; the fake workers never open it. With
    `size`, the file is that long (sparse: it takes no disk), for what a model costs."""
    key, value = b"general.architecture", b"fake"
    path.write_bytes(
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
        + struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) + struct.pack("<Q", len(value)) + value
    )
    if size is not None:
        os.truncate(path, size)
    return path


def make_config(
    tmp_path: Path, models: dict[str, dict[str, object]], **supervisor: object
) -> Config:
    """A parsed config, with an empty dummy.gguf in tmp_path."""
    write_gguf(tmp_path / "dummy.gguf")
    return parse(config_text(models, **supervisor), tmp_path)


def write_config(
    path: Path, models: dict[str, dict[str, object]], server: dict[str, object] | None = None,
    **supervisor: object,
) -> Path:
    """The same config as a file (for reloads), with dummy.gguf beside it."""
    write_gguf(path.parent / "dummy.gguf")
    path.write_text(config_text(models, server, **supervisor))
    return path


@asynccontextmanager
async def running(sup: Supervisor) -> AsyncIterator[Supervisor]:
    """Run the supervisor for the duration of the block; leaving it stops the supervisor
    gracefully (Supervisor.stop), as corral serve does on SIGTERM."""
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        try:
            yield sup
        finally:
            with trio.move_on_after(10):
                await sup.stop()
            nursery.cancel_scope.cancel()


def config_problems(text: str, base: Path) -> list[str]:
    """The problems `corral config check` finds in `text` (read relative to `base`); the
    text must have some."""
    try:
        parse(text, base)
    except ConfigError as exc:
        return exc.problems
    raise AssertionError("the config has no problem")
