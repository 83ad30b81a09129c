"""`python -m worker --fd N --spec JSON`: one model, served over an inherited socket."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import msgspec
import trio

from worker import log_format
from worker.link import serve
from worker.protocol import WorkerSpec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m worker")
    ap.add_argument("--fd", type=int, required=True, help="inherited socketpair end")
    ap.add_argument("--spec", required=True, help="WorkerSpec as JSON")
    args = ap.parse_args(argv)
    spec = msgspec.json.decode(args.spec, type=WorkerSpec)
    log_format.configure(log_format.level_from_environment(), log_format.from_environment(), model=spec.name)
    # Ctrl-C in a terminal reaches the whole process group; the supervisor decides when a
    # worker stops, so the worker ignores it instead of dying mid-request.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    trio.run(serve, args.fd, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
