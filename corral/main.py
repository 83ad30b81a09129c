"""`corral`: the command line.

  corral serve [--config FILE] [--host H] [--port P] [--models-dir DIR]
                                  run the router and the supervisor in one process
  corral config check [FILE]      validate a config file and report every problem
  corral config show [--json]     the effective config, defaults filled in, keys masked
  corral config set KEY VALUE...  edit one key (models."qwen2.5".slots 8), typed by the schema
  corral config unset KEY         back to the default
  corral config add-model NAME PATH [--alias A ...] [--slots N] ...
  corral config remove-model NAME
                                  edits keep the rest of the file byte for byte, are checked
                                  as serve checks a file, and are written atomically;
                                  --reload then POSTs /admin/reload (or, unreachable or with
                                  --signal, sends SIGHUP to [server] pid_file's pid)
  corral status | load NAME | unload NAME | reset NAME | reload
                                  see and steer a running server (corral/admin_commands.py)
  corral usage [--key K] [--by day] [--csv]
                                  who used how much: the usage ledger (corral/usage_command.py)
  corral chat MODEL [--url URL | --config FILE]
                                  chat in the terminal, over HTTP or in-process
  corral --version

Without --config, a command uses the first of $CORRAL_CONFIG, ./corral.toml,
~/.config/corral/config.toml and /etc/corral/config.toml (supervisor/config/search.py).

This module builds the argument parser; each subcommand lives in a module of its own
(corral/serve.py, corral/config_commands.py, corral/admin_commands.py, corral/chat/).
"""

from __future__ import annotations

import argparse
import importlib.metadata

from corral import admin_commands, config_commands, usage_command
from corral.args import add_config_option
from corral.chat import terminal
from corral.serve import serve_command


def _version() -> str:
    try:
        return importlib.metadata.version("corral")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="corral", description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", action="version", version=f"corral {_version()}")
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the models of a config file")
    add_config_option(s)
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument("--host", help="address to listen on (overrides [server] host)")
    s.add_argument("--port", type=int, help="port to listen on (overrides [server] port)")
    s.add_argument(
        "--models-dir",
        metavar="DIR",
        help="serve every *.gguf in DIR under its file stem (overrides [server] models_dir); "
        "with it, no config file is needed",
    )
    s.set_defaults(run=serve_command)
    # Each further subcommand lives in a module of its own, with an add(sub) that sets
    # its parser's `run`.
    config_commands.add(sub)
    terminal.add(sub)
    admin_commands.add(sub)
    usage_command.add(sub)
    args = ap.parse_args(argv)
    return int(args.run(args))
