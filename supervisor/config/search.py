"""Which config file a command uses when it is not given one.

Like git's and systemd's search paths: the first that exists of `$CORRAL_CONFIG`,
`./corral.toml`, `~/.config/corral/config.toml` and `/etc/corral/config.toml`. An explicit
`--config` always wins, and a `$CORRAL_CONFIG` that names a missing file is an error rather
than a silent fall-through to another file.
"""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.config.schema import ConfigError

ENV = "CORRAL_CONFIG"


def candidates(env: dict[str, str] | None = None) -> list[Path]:
    """The places looked in, in order (`env` defaults to the process environment)."""
    env = dict(os.environ) if env is None else env
    home = Path(env.get("HOME") or Path.home())
    xdg = env.get("XDG_CONFIG_HOME") or str(home / ".config")
    return [Path("corral.toml"), Path(xdg) / "corral" / "config.toml", Path("/etc/corral/config.toml")]


def find(explicit: str | None, env: dict[str, str] | None = None) -> tuple[Path, str]:
    """The config file to use, and how it was chosen ("--config", "$CORRAL_CONFIG", or
    "found at PATH"). Raises ConfigError listing every place looked in."""
    env = dict(os.environ) if env is None else env
    if explicit is not None:
        return Path(explicit), "--config"
    if named := env.get(ENV):
        path = Path(named)
        if not path.is_file():
            raise ConfigError([f"(file): ${ENV} names {named}, which is not a file"])
        return path, f"${ENV}"
    if (found := find_or_none(explicit, env)) is not None:
        return found
    looked = ", ".join(str(p) for p in candidates(env))
    raise ConfigError([f"(file): no config file given (--config) and none found: ${ENV} is unset; looked in {looked}"])


def find_or_none(explicit: str | None, env: dict[str, str] | None = None) -> tuple[Path, str] | None:
    """As `find`, but None where no file is given and none of the search path exists
    (`corral serve --models-dir DIR` then runs with every default). A $CORRAL_CONFIG that
    names a missing file is still an error."""
    env = dict(os.environ) if env is None else env
    if explicit is not None or env.get(ENV):
        return find(explicit, env)
    for path in candidates(env):
        if path.is_file():
            return path, "the first of the search path"
    return None
