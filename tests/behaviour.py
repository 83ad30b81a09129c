"""How a test worker misbehaves: one definition for the process fake and the in-process sim.

tests/fake_worker.py (a real process, configured through FAKE_* environment variables, since
the supervisor starts it) and tests/sim_worker.py (a trio task, configured by the test
directly) act out the same behaviours: a slow or failed load, an exit at start, a decode
pace, a hang, an ignored Shutdown. `Behaviour` names each once; `Behaviour.from_env` is the
fake worker's reading of its environment.

Environment rules (FAKE_<FLAG>, for the fields marked "env" below)
-----------------------------------------------------------------
Every flag is read as FAKE_<FLAG>, the field's name in upper case. A per-model value
FAKE_<FLAG>__<name>, where <name> is the model's name with every character outside
[A-Za-z0-9] replaced by "_" (case kept), takes precedence over it; an empty value means
"unset", so FAKE_CRASH_AFTER__other= turns a global FAKE_CRASH_AFTER off for the model
"other". Booleans are true unless empty, "0", "false", "no" or "off" (any case, spaces
around ignored). Numbers are Python float()/int() literals.

This module imports only the standard library: the fake worker imports it and must start in
a fraction of a second.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

_FALSE = {"", "0", "false", "no", "off"}
# FAKE_FAIL_LOAD=1 asks for a failure without caring about its message.
_DEFAULT_FAILURE = {"1", "true", "yes"}


@dataclass
class Behaviour:
    """One worker's behaviour; the defaults are a healthy worker.

    Honoured by both workers (env: FAKE_<FIELD>):
      load_delay       seconds between Loading(0.0) and Ready
      fail_load        send Failed(message) instead of Ready, then exit (the fake with code 1);
                       in the environment the values 1/true/yes mean "fake load failure"
      exit_at_start    exit before sending any frame (the fake with code 3)
      tokens_per_sec   decode steps per second; the default is fast, so a test that needs a
                       request to stay in flight sets a slow pace itself
      hang             after Ready, answer nothing again, not even Ping or Shutdown (a
                       SIGSTOPped worker); the fake still exits by itself after 60 s
      ignore_shutdown  ignore Shutdown frames, so only the launcher's kill stops it

    Honoured by the process fake only (env): start_log, alloc_mb and ignore_sigterm concern a
    process (its pid, its RSS, its signals); crash_after is the fake's way to crash mid-stream
    (the sim has die_after for that):
      start_log        append "<model name> <pid>\\n" to this file on every start, before any
                       other flag acts (so exit_at_start starts are counted)
      alloc_mb         hold this many MiB of resident memory from load on (RSS is measured)
      crash_after      os._exit(1) when about to produce token n+1, counting every token the
                       process has produced for any request
      ignore_sigterm   ignore SIGTERM (only SIGKILL stops it)

    Honoured by the sim only (no env variable), whose virtual clock makes a timer exact:
      die_after        close the socket this many seconds after Ready (a crash)
    """

    load_delay: float = 0.0
    fail_load: str | None = None
    exit_at_start: bool = False
    tokens_per_sec: float = 200.0
    hang: bool = False
    ignore_shutdown: bool = False
    # process fake only
    start_log: str | None = None
    alloc_mb: float = 0.0
    crash_after: int | None = None
    ignore_sigterm: bool = False
    # sim only
    die_after: float | None = None

    @classmethod
    def from_env(cls, model: str, environ: Mapping[str, str] | None = None) -> Behaviour:
        """The behaviour the FAKE_* variables give `model` (see the module docstring)."""
        flags = _Flags(model, os.environ if environ is None else environ)
        fail = flags.raw("FAIL_LOAD")
        if fail is not None and fail.strip().lower() in _DEFAULT_FAILURE:
            fail = "fake load failure"
        crash = flags.raw("CRASH_AFTER")
        default = cls()
        return cls(
            load_delay=flags.number("LOAD_DELAY", default.load_delay),
            fail_load=fail,
            exit_at_start=flags.boolean("EXIT_AT_START"),
            tokens_per_sec=flags.number("TOKENS_PER_SEC", default.tokens_per_sec),
            hang=flags.boolean("HANG"),
            ignore_shutdown=flags.boolean("IGNORE_SHUTDOWN"),
            start_log=flags.raw("START_LOG"),
            alloc_mb=flags.number("ALLOC_MB", default.alloc_mb),
            crash_after=int(crash) if crash is not None else None,
            ignore_sigterm=flags.boolean("IGNORE_SIGTERM"),
        )


def env_key(model: str) -> str:
    """The suffix of a per-model flag: FAKE_<FLAG>__<env_key(model)>."""
    return re.sub(r"[^A-Za-z0-9]", "_", model)


class _Flags:
    def __init__(self, model: str, environ: Mapping[str, str]) -> None:
        self.suffix = env_key(model)
        self.environ = environ

    def raw(self, name: str) -> str | None:
        base = f"FAKE_{name}"
        per = f"{base}__{self.suffix}"
        # Presence, not truth: an empty per-model value overrides the global one with "unset".
        value = self.environ[per] if per in self.environ else self.environ.get(base)
        return None if value is None or value == "" else value

    def boolean(self, name: str) -> bool:
        v = self.raw(name)
        return v is not None and v.strip().lower() not in _FALSE

    def number(self, name: str, default: float) -> float:
        v = self.raw(name)
        return default if v is None else float(v)
