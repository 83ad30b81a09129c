"""`corral config ...`: check, show and edit a config file.

  check [FILE]                       validate, report every problem
  show [--json]                      the effective config, defaults filled in, keys masked
  set KEY VALUE...                   set a key (models."qwen2.5".slots 8), typed by the schema
  unset KEY                          back to the default
  add-model NAME PATH [options]      a new [models.NAME] table
  remove-model NAME

An edit keeps the rest of the file byte for byte (supervisor/config/edit.py), is checked
as `serve` checks a file, and is written atomically, or refused with the file untouched
(supervisor/config/rewrite.py). `--reload` then tells the running server
(corral/reload_client.py). Exit status: 0 done, 1 refused (nothing written), 3 written but
the server did not reload.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from corral import reload_client
from corral.admin_target import reload_lines
from corral.args import add_config_option, config_path, print_problems
from supervisor.config import edit as config_edit, presets, show as config_show
from supervisor.config import ConfigError, from_bytes, load
from supervisor.config.key_paths import SECRET_FIELDS, EditError
from supervisor.config.rewrite import Rewritten, rewrite
from supervisor.config.templates import BUILTIN_CHAT_TEMPLATES

if TYPE_CHECKING:
    from corral.args import Subparsers

EXIT_REFUSED = 1
EXIT_NOT_RELOADED = 3


def add(sub: Subparsers) -> None:
    c = sub.add_parser("config", help="check, show and edit a config file")
    csub = c.add_subparsers(dest="config_command", required=True)
    chk = csub.add_parser("check", help="validate a config file and report every problem")
    chk.add_argument("file", nargs="?", help="the file (or --config, or the search path)")
    add_config_option(chk)
    chk.set_defaults(run=check)

    show = csub.add_parser("show", help="the effective config: every default filled in, keys masked")
    add_config_option(show)
    show.add_argument("--json", action="store_true", help="JSON instead of TOML (unset keys as null)")
    show.set_defaults(run=show_command)

    s = csub.add_parser(
        "set", help="set a key",
        description='Set KEY (a dotted path: server.port, models."qwen2.5".slots) to VALUE, '
        "typed by the schema: 8, 2.5, true, \"text\", 12GiB, [\"a\", \"b\"]; a list key takes "
        "one word per item too.",
    )
    s.add_argument("key")
    s.add_argument("value", nargs="+")
    _edit_options(s)
    s.set_defaults(run=set_command)

    u = csub.add_parser("unset", help="remove a key, so that its default applies")
    u.add_argument("key")
    _edit_options(u)
    u.set_defaults(run=unset_command)

    a = csub.add_parser("add-model", help="add a [models.NAME] table")
    a.add_argument("name")
    a.add_argument("path", help="the GGUF; written relative to the config file's folder")
    a.add_argument("--alias", action="append", default=[], help="another name for it (repeatable)")
    a.add_argument("--slots", help="concurrent requests")
    a.add_argument("--n-ctx", help="KV cells shared by all slots")
    a.add_argument("--n-batch", help="most tokens in one decode step")
    a.add_argument("--threads", help="CPU threads (default: a share of the cores)")
    a.add_argument("--n-gpu-layers", help="layers offloaded to the GPU (-1: all)")
    a.add_argument("--chat-template", help="a built-in template's name, or a Jinja file")
    a.add_argument("--embeddings", action="store_true", help="serve /v1/embeddings, not chat")
    a.add_argument("--pooling", help="embeddings pooling: mean, cls or last")
    a.add_argument("--tool-format", help="auto, hermes, llama3, mistral or generic")
    a.add_argument("--idle-timeout", help="seconds idle before unloading")
    a.add_argument("--max-tokens", help="token limit of a request that sets none")
    a.add_argument("--preload", action="store_true", help="load at start")
    a.add_argument("--pinned", action="store_true", help="never unload for idleness")
    a.add_argument(
        "--option", "-o", action="append", default=[], metavar="KEY=VALUE",
        help="any other key of the model's table, typed as `set` types it (repeatable)",
    )
    _edit_options(a)
    a.set_defaults(run=add_model_command)

    ip = csub.add_parser(
        "import-preset", help="translate llama-server's models preset INI into Corral's TOML",
        description="Print the Corral config that serves what llama-server's --models-preset FILE "
        "describes: [*] as [model_defaults], each section as a [models.NAME] table, every key "
        "with a comment naming its source line; keys Corral has no meaning for stay as comments.",
    )
    ip.add_argument("file", help="the preset INI file")
    ip.set_defaults(run=import_preset_command)

    r = csub.add_parser("remove-model", help="remove a [models.NAME] table")
    r.add_argument("name")
    _edit_options(r)
    r.set_defaults(run=remove_model_command)


def _edit_options(p: argparse.ArgumentParser) -> None:
    add_config_option(p)
    p.add_argument("--reload", action="store_true", help="then tell the running server (POST /admin/reload, else SIGHUP)")
    p.add_argument("--signal", action="store_true", help="with --reload: SIGHUP to [server] pid_file's pid")
    p.add_argument("--url", help=f"with --reload: the server's URL (default ${reload_client.ENV_URL}, else [server] host:port)")
    p.add_argument(
        "--admin-key-file", metavar="FILE",
        help=f"with --reload: a file holding the admin key (default ${reload_client.ENV_ADMIN_KEY})",
    )


def check(args: argparse.Namespace) -> int:
    try:
        path = config_path(args.file or args.config)
        cfg = load(path)
    except ConfigError as exc:
        print_problems(exc)
        return 1
    if cfg.unloadable:  # serve would run the rest, but this file is not right
        print_problems(ConfigError(list(cfg.unloadable.values()), str(path)))
        return 1
    names = [*cfg.models, *(name for name in cfg.upstreams if name not in cfg.models)]
    print(f"{path}: ok ({len(names)} model(s): {', '.join(names)})")
    return 0


def show_command(args: argparse.Namespace) -> int:
    try:
        path = config_path(args.config)
        cfg = load(path)
    except ConfigError as exc:
        print_problems(exc)
        return 1
    for problem in cfg.unloadable.values():  # shown, as serve would run it: failed
        print(f"{path}: {problem}", file=sys.stderr)
    data = config_show.effective(cfg)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(f"# {path.resolve()}, as corral serve would run it: every default filled in, keys masked")
        print(config_show.to_toml(data), end="")
    return 0


def set_command(args: argparse.Namespace) -> int:
    return _edit(args, lambda text: config_edit.set_key(text, args.key, args.value), "already so")


def unset_command(args: argparse.Namespace) -> int:
    return _edit(
        args, lambda text: config_edit.unset_key(text, args.key)[0], f"{args.key} is not set in the file: already the default"
    )


def add_model_command(args: argparse.Namespace) -> int:
    fields: dict[str, list[str]] = {}
    options = (
        "slots", "n_ctx", "n_batch", "threads", "n_gpu_layers", "chat_template", "pooling",
        "tool_format", "idle_timeout", "max_tokens",
    )
    for key in options:
        if (value := getattr(args, key)) is not None:
            fields[key] = [value]
    for flag in ("embeddings", "preload", "pinned"):
        if getattr(args, flag):
            fields[flag] = ["true"]
    if args.alias:
        fields["aliases"] = [json.dumps(args.alias)]
    for option in args.option:
        key, eq, value = option.partition("=")
        if not eq or not key.strip():
            print(f"--option: expected KEY=VALUE, got {option!r}", file=sys.stderr)
            return EXIT_REFUSED
        fields[key.strip()] = [value]

    def edit(text: str) -> str:
        # PATH (and a template file) are as the operator typed them, from here; the file
        # reads them from its folder.
        template = args.chat_template
        if template is not None and template not in BUILTIN_CHAT_TEMPLATES and Path(template).is_file():
            fields["chat_template"] = [_relative_to(template, folder)]
        return config_edit.add_model(text, args.name, {"path": [_relative_to(args.path, folder)], **fields})

    folder = Path()
    try:
        folder = config_path(args.config).resolve().parent
    except ConfigError:
        pass  # _edit reports it
    return _edit(args, edit)


def _relative_to(path: str, folder: Path) -> str:
    """`path` (from the current folder) as the config file reads it (from its folder):
    relative where it lies under that folder, else absolute."""
    full = Path(os.path.abspath(os.path.expanduser(path)))
    try:
        return full.relative_to(folder).as_posix()
    except ValueError:
        return str(full)


def remove_model_command(args: argparse.Namespace) -> int:
    return _edit(args, lambda text: config_edit.remove_model(text, args.name))


def _edit(args: argparse.Namespace, edit: Callable[[str], str], nothing: str = "nothing to change") -> int:
    """Apply an edit to the config file, say what changed, and reload if asked."""
    if args.signal and not args.reload:
        print("--signal goes with --reload", file=sys.stderr)
        return EXIT_REFUSED
    try:
        path = config_path(args.config)
    except ConfigError as exc:
        print_problems(exc)
        return EXIT_REFUSED
    try:
        done = rewrite(path, edit)
    except ConfigError as exc:
        print_problems(exc)
        print(f"{path}: refused, not changed", file=sys.stderr)
        return EXIT_REFUSED
    except EditError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        print(f"{path}: refused, not changed", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:
        print(f"{path}: cannot write: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if not done.changed:
        print(f"{path}: {nothing}; not written")
    else:
        _report_edit(done)
    if not args.reload:
        return 0
    return _reload(args, done)


def _report_edit(done: Rewritten) -> None:
    """The changed lines, with every key (api_keys, admin_keys) in them masked: the
    terminal's scrollback is no place for one."""
    diff = difflib.unified_diff(done.before.splitlines(True), done.after.splitlines(True), n=0)
    secrets = sorted(_secrets(done.before) | _secrets(done.after), key=len, reverse=True)
    print(f"{done.path}: written")
    for line in diff:
        if line.startswith(("---", "+++", "@@")):
            continue
        for secret in secrets:  # as written in the file, escaped or not
            line = line.replace(secret, config_show.MASK).replace(json.dumps(secret)[1:-1], config_show.MASK)
        print("  " + line.rstrip("\n"))


def _secrets(text: str) -> set[str]:
    """Every key string the file's [server] holds (api_keys, their tables' key, admin_keys)."""
    try:
        server = tomllib.loads(text).get("server", {})
    except tomllib.TOMLDecodeError:
        return set()
    found: set[str] = set()

    def walk(value: object, secret: bool) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k in SECRET_FIELDS)
        elif isinstance(value, list):
            for v in value:
                walk(v, secret)
        elif secret and isinstance(value, str) and value:
            found.add(value)

    walk(server, False)
    return found


def _reload(args: argparse.Namespace, done: Rewritten) -> int:
    # The server listens where the file said before this edit (a new port or pid_file
    # takes a restart), so that is where it is reached; the new one if the old was broken.
    try:
        running = from_bytes(done.before.encode("utf-8"), done.path)
    except ConfigError:
        running = done.config
    try:
        t = reload_client.target(running, args.url, args.admin_key_file)
        how, answer = reload_client.reload(t, use_signal=args.signal)
    except reload_client.ReloadError as exc:
        print(f"reload: {exc} (the file is written; the server runs the old config)", file=sys.stderr)
        return EXIT_NOT_RELOADED
    print(f"reload: {how}")
    if answer is None:
        print(f"reload: no report; the server applies the file within about {t.settle:g}s (see its log, or GET /admin/models config_error)")
        return 0
    if answer.get("type") == "config_error":
        print(f"reload: the server refused the file: {'; '.join(answer.get('problems', []))}", file=sys.stderr)
        return EXIT_NOT_RELOADED
    _print_diff(answer)
    return 0


def _print_diff(answer: dict[str, Any]) -> None:
    for line in reload_lines(answer):  # as `corral reload` prints them
        print(f"reload: {line}")


def import_preset_command(args: argparse.Namespace) -> int:
    """Print the TOML for a llama-server preset file; 1 when it cannot be read."""
    try:
        text = Path(args.file).read_text(encoding="utf-8")
        print(presets.import_preset(text, Path(args.file).name), end="")
    except (OSError, UnicodeDecodeError, presets.PresetError) as exc:
        print(f"corral config import-preset: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return 0
