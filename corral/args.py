"""What every `corral` subcommand shares: finding the config file, printing problems."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from supervisor.config import search as config_search
from supervisor.config import ConfigError

if TYPE_CHECKING:  # generic only to the type checker; used in annotations alone
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=(
            f"the config file; without it, the first of ${config_search.ENV}, ./corral.toml, "
            "~/.config/corral/config.toml, /etc/corral/config.toml"
        ),
    )


def config_path(explicit: str | None) -> Path:
    """The config file a command uses; says which on stderr when it was searched for, so
    that nobody edits one file while the command reads another. Raises ConfigError."""
    path, how = config_search.find(explicit)
    if how != "--config":
        print(f"corral: using {path} ({how})", file=sys.stderr)
    return path


def print_problems(exc: ConfigError) -> None:
    for problem in exc.problems:
        print(f"{exc.source}: {problem}" if exc.source else problem, file=sys.stderr)
