"""Stands in for the `llama-server` binary: reads its flags, writes the Corral config that
serves the same, and becomes `corral serve` on it.

Run as `python -m tests.peer.launch_corral FLAGS...` from a wrapper script that
llama.cpp's test suite finds through LLAMA_SERVER_BIN_PATH. The GGUF that stands in for
models named by Hugging Face repository is $PEER_MODEL. The config is written next to the
suite's temporary files ($PEER_WORK, default the system's), one per port, so that parallel
test workers do not share one. The suite's download-only starts get a stand-in that answers
/health and nothing else (`is_download`).
"""

from __future__ import annotations

import ast
import dataclasses
import http.server
import os
import sys
import tempfile
from pathlib import Path

import tomlkit

from supervisor.config.gguf_meta import read_metadata
from tests.peer.llama_flags import corral_config, read_flags


def is_download(argv: list[str], suite: Path) -> bool:
    """The suite's session set-up (`ServerPreset.load_all`, in its utils.py) starts each of
    its presets once, to download its model from Hugging Face, and stops it as soon as
    /health answers 200. Such a start names a preset's repository and file without
    --offline; every test starts presets with --offline, and the tests that start without
    it name other models (split files, router presets, real models)."""
    if "--offline" in argv:
        return False
    repo = _flag(argv, "--hf-repo", "-hf")
    return repo is not None and (repo, _flag(argv, "--hf-file", "-hff")) in preset_models(suite / "utils.py")


def _flag(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg in names:
            return argv[i + 1]
    return None


def preset_models(utils: Path) -> set[tuple[str, str | None]]:
    """(repository, file) of each of the suite's ServerPreset methods, read from its source:
    a preset sets `server.model_hf_repo` and `server.model_hf_file` on a ServerProcess, or
    keeps that class's defaults."""
    tree = ast.parse(utils.read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    defaults: dict[str, str | None] = {}
    for stmt in classes["ServerProcess"].body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            if isinstance(stmt.value, ast.Constant) and stmt.target.id in ("model_hf_repo", "model_hf_file"):
                defaults[stmt.target.id] = _text(stmt.value)
    models: set[tuple[str, str | None]] = set()
    for method in classes["ServerPreset"].body:
        if not isinstance(method, ast.FunctionDef) or method.name == "load_all":
            continue
        fields = dict(defaults)
        for node in ast.walk(method):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and target.attr in fields:
                        fields[target.attr] = _text(node.value)
        if fields.get("model_hf_repo"):
            models.add((str(fields["model_hf_repo"]), fields.get("model_hf_file")))
    return models


def _text(c: ast.Constant) -> str | None:
    return None if c.value is None else str(c.value)


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        ok = self.path == "/health"
        body = b'{"status":"ok"}' if ok else b'{"error":"a download stand-in serves /health only"}'
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def stand_in_for_download(host: str, port: int) -> None:
    """What llama-server does for such a start once its model is in its cache, less the
    load: every model here is the local $PEER_MODEL, so there is nothing to fetch, and a
    real Corral start would be stopped before its model could load. One such session cost
    eight server starts (about 11 s a run of the suite; `make test` runs it in four parts)."""
    print(f"launch_corral: download-only start (no --offline): nothing to fetch; /health on {host}:{port}",
          file=sys.stderr)
    with http.server.HTTPServer((host, port), _Health) as server:
        server.serve_forever()


def main(argv: list[str]) -> None:
    flags = read_flags(argv, os.environ["PEER_MODEL"])
    if is_download(argv, Path(os.environ.get("PEER_SUITE", "."))):
        stand_in_for_download(flags.host.split(",")[0].strip() or "127.0.0.1", flags.port)
        return
    # llama-server reads relative paths from its working directory; Corral from the
    # config file's folder, which is elsewhere.
    for key in ("model", "chat_template_file", "models_dir", "models_preset"):
        if isinstance(value := getattr(flags, key), str):
            flags = dataclasses.replace(flags, **{key: os.path.abspath(value)})  # type: ignore[arg-type]
    flags = dataclasses.replace(flags, lora=tuple((os.path.abspath(f), scale) for f, scale in flags.lora))
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
