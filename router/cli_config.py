"""`corral config ...`: check a config file."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from router.cli_common import add_config_option, config_path, print_problems
from supervisor.config import ConfigError, load

if TYPE_CHECKING:
    from router.cli_common import Subparsers


def add(sub: Subparsers) -> None:
    c = sub.add_parser("config", help="check a config file")
    csub = c.add_subparsers(dest="config_command", required=True)
    chk = csub.add_parser("check", help="validate a config file and report every problem")
    chk.add_argument("file", nargs="?", help="the file (or --config, or the search path)")
    add_config_option(chk)
    chk.set_defaults(run=check)


def check(args: argparse.Namespace) -> int:
    try:
        path = config_path(args.file or args.config)
        cfg = load(path)
    except ConfigError as exc:
        print_problems(exc)
        return 1
    names = ", ".join(cfg.models)
    print(f"{path}: ok ({len(cfg.models)} model(s): {names})")
    return 0
