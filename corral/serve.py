"""`corral serve`: the composition root. It builds the supervisor and the HTTP app and runs
both in one trio nursery until SIGINT or SIGTERM, reloading on SIGHUP, and keeps systemd
posted. It lives in the command-line package because nothing else may know both halves:
imports go corral -> router -> supervisor -> worker.protocol.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Sequence

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve as hypercorn_serve

from corral.args import config_path, print_problems
from corral.listen import CannotListen, open_listeners
from router.app import create_app
from router.usage import gate as usage_gate
from router.upstream import service as upstream_service
from router.server.auth import refuse_bind
from supervisor import pid_file
from supervisor.config import search as config_search
from supervisor.config import Config, ConfigError, listen_hosts, load, without_file
from supervisor.supervisor import Supervisor
from supervisor.systemd import Notifier
from worker import log_format

log = logging.getLogger("corral")


async def serve(
    cfg: Config,
    *,
    worker_command: Sequence[str] | None = None,
    server_overrides: dict[str, object] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGINT or SIGTERM: then stop accepting, finish responses, stop workers.

    `worker_command` replaces `python -m worker` (the tests run the whole server with fake
    workers); `server_overrides` are [server] keys given on the command line. Raises
    CannotListen, before any worker starts, when an address cannot be bound."""
    notifier = Notifier()
    supervisor = Supervisor(cfg, worker_command=worker_command, notifier=notifier, server_overrides=server_overrides)
    cfg = supervisor.config
    fds = open_listeners(listen_hosts(cfg.server), cfg.server.port)
    adopted = trio.Event()
    try:
        await _serve_on(cfg, supervisor, notifier, [f"fd://{fd}" for fd in fds], adopted, task_status)
    finally:
        # hypercorn owns each descriptor once it has started, and closes it when it stops;
        # a failure before that (the supervisor's start) leaves them to be closed here.
        if not adopted.is_set():
            for fd in fds:
                os.close(fd)


async def _serve_on(
    cfg: Config,
    supervisor: Supervisor,
    notifier: Notifier,
    binds: list[str],
    adopted: trio.Event,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    app = create_app(supervisor, cfg)
    hc = HyperConfig()
    hc.bind = binds
    # hypercorn's messages through our logging (its own handler would print every line
    # twice, and not as JSON); the access log is Corral's own (router/server/access_log.py).
    hc.errorlog = logging.getLogger("hypercorn.error")
    if cfg.server.tls_cert is not None:
        hc.certfile, hc.keyfile = cfg.server.tls_cert, cfg.server.tls_key
    hc.graceful_timeout = 30.0
    stop = trio.Event()
    # SIGHUP is caught from here on, before READY=1: systemd >= 262 requires it of a
    # notify-reload service, and an uncaught SIGHUP would kill the server. The pid file is
    # written after that, for the same reason, and removed however serve() ends.
    with (
        trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals,
        pid_file.held(cfg.server.pid_file),
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            upstreams = upstream_service.of(app)
            nursery.start_soon(upstreams.run)

            # hypercorn returns once `stop` is set and its connections are done; the workers
            # are stopped below, after the drain, not when hypercorn happens to finish.
            binds = await nursery.start(
                partial(hypercorn_serve, app, hc, shutdown_trigger=stop.wait)
            )
            adopted.set()
            names = [*cfg.models, *(name for name in cfg.upstreams if name not in cfg.models)]
            log.info("listening on %s with %d model(s): %s", ", ".join(binds), len(names), ", ".join(names))
            task_status.started(binds)
            notifier.notify("READY=1", f"STATUS={supervisor.status_line()}")
            if notifier.enabled:
                nursery.start_soon(_keep_systemd_posted, notifier, supervisor)

            async for sig in signals:
                if sig == signal.SIGHUP:
                    log.info(
                        "SIGHUP received: reloading %s once it stops changing",
                        cfg.source or f"models_dir {cfg.server.models_dir}",  # --models-dir without a file
                    )
                    supervisor.request_reload()
                    continue
                log.info("%s received: shutting down", signal.Signals(sig).name)
                break
            # Stop accepting, let requests in flight finish, then cancel everything. Waiting
            # on our own in-flight count rather than hypercorn's graceful shutdown matters:
            # hypercorn holds idle keep-alive connections open for its whole timeout.
            stop.set()
            notifier.notify("STOPPING=1", "STATUS=draining requests and stopping workers")
            with trio.move_on_after(cfg.server.drain_timeout):
                await supervisor.wait_idle()
                while upstreams.in_flight:  # relayed requests drain too
                    await trio.sleep(0.05)
            if supervisor.in_flight or upstreams.in_flight:
                log.warning(
                    "drain_timeout reached with %d request(s) in flight", supervisor.in_flight + upstreams.in_flight
                )
            # Stop workers gracefully; the bound covers a worker that ignores everything
            # (stop_grace for Shutdown, then for SIGTERM, then SIGKILL).
            with trio.move_on_after(3 * cfg.supervisor.stop_grace + 5):
                await supervisor.stop()
            # What the ledger has queued is written before the process ends.
            await trio.to_thread.run_sync(usage_gate.of(app).ledger.close)
            nursery.cancel_scope.cancel()


async def _keep_systemd_posted(notifier: Notifier, supervisor: Supervisor) -> None:
    """WATCHDOG=1 at half of WATCHDOG_USEC, and STATUS= whenever it changes.

    The pings come from this event loop itself, so a wedged loop stops pinging and systemd
    restarts the service; a thread would keep pinging for a dead server. Each round also
    sends what a receiver with no room left waiting (supervisor/systemd.py): READY=1 and
    the like reach systemd within a second of its reading again.
    """
    period = min(notifier.watchdog_interval or 1.0, 1.0)
    last_status = ""
    while True:
        lines = ["WATCHDOG=1"] if notifier.watchdog_interval else []
        status = supervisor.status_line()
        if status != last_status:
            lines.append(f"STATUS={status}")
            last_status = status
        if lines:
            notifier.notify(*lines)
        else:
            notifier.flush()
        await trio.sleep(period)


def serve_command(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {
        key: value for key, value in (("host", args.host), ("port", args.port)) if value is not None
    }
    if args.models_dir is not None:
        # Absolute now: the file's models_dir is relative to the file, this to the cwd.
        folder = Path(args.models_dir).expanduser().resolve()
        if not args.models_dir.strip():  # Path("") is the cwd: never what was meant
            print("--models-dir: must not be empty", file=sys.stderr)
            return 1
        if not folder.is_dir():
            print(f"--models-dir: no such folder: {folder}", file=sys.stderr)
            return 1
        overrides["models_dir"] = str(folder)
    if args.port is not None and not 0 <= args.port <= 65535:
        print(f"--port: must be 0..65535, got {args.port}", file=sys.stderr)
        return 1
    try:
        if args.models_dir is not None and config_search.find_or_none(args.config) is None:
            print("corral: no config file; serving the models of --models-dir with every default", file=sys.stderr)
            path: Path | str = "--models-dir"
            cfg = without_file(overrides)
        else:
            path = config_path(args.config)
            cfg = load(path, overrides)
    except ConfigError as exc:
        print_problems(exc)
        return 1
    level = getattr(logging, args.log_level.upper())
    log_format.configure(level, cfg.server.log_format)
    log_format.hand_down(level, cfg.server.log_format)
    for host in listen_hosts(cfg.server):
        if (why := refuse_bind(host, cfg.keys, cfg.server.allow_insecure_bind)) is not None:
            print(f"{path}: {why}", file=sys.stderr)
            return 1
    try:
        trio.run(partial(serve, cfg, server_overrides=overrides))
    except ConfigError as exc:  # what only starting finds out (the state_dir's ledger)
        print_problems(exc)
        return 1
    except CannotListen as exc:
        hint = "choose another port with --port N (make serve PORT=N)"
        if isinstance(path, Path):
            hint += f" or [server] port in {path}"
        print(f"corral: {exc}; {hint}", file=sys.stderr)
        return 1
    return 0

