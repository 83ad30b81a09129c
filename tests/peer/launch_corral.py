"""Stands in for the `llama-server` binary: reads its flags, writes the Corral config that
serves the same, and becomes `corral serve` on it.

Run as `python -m tests.peer.launch_corral FLAGS...` from a wrapper script that
llama.cpp's test suite finds through LLAMA_SERVER_BIN_PATH. The GGUF that stands in for
models named by Hugging Face repository is $PEER_MODEL. The config is written next to the
suite's temporary files ($PEER_WORK, default the system's), one per port, so that parallel
test workers do not share one.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path

import tomlkit

from supervisor.config.gguf_meta import read_metadata
from tests.peer.llama_flags import corral_config, read_flags


def main(argv: list[str]) -> None:
    flags = read_flags(argv, os.environ["PEER_MODEL"])
    # llama-server reads relative paths from its working directory; Corral from the
    # config file's folder, which is elsewhere.
    for key in ("model", "chat_template_file", "models_dir", "models_preset"):
        if isinstance(value := getattr(flags, key), str):
            flags = dataclasses.replace(flags, **{key: os.path.abspath(value)})  # type: ignore[arg-type]
    has_template = flags.model is not None and "tokenizer.chat_template" in read_metadata(Path(flags.model))
    work = Path(os.environ.get("PEER_WORK", tempfile.gettempdir()))
    work.mkdir(parents=True, exist_ok=True)
    router = work / "router-models"  # router mode's stand-in for llama-server's model cache
    router.mkdir(exist_ok=True)
    if not (router / "stand-in.gguf").exists():
        (router / "stand-in.gguf").symlink_to(os.environ["PEER_MODEL"])
    config = corral_config(flags, has_template, str(router))
    path = work / f"corral-{flags.port}.toml"
    path.write_text(tomlkit.dumps(config))
    if flags.ignored:
        print(f"launch_corral: flags with no Corral meaning: {', '.join(flags.ignored)}", file=sys.stderr)
    print(f"launch_corral: {path}", file=sys.stderr)
    os.execv(sys.executable, [sys.executable, "-m", "corral", "serve", "--config", str(path)])


if __name__ == "__main__":
    main(sys.argv[1:])
