"""`corral config ... --reload`: tell the running server to reload, and say what it did.

Two ways, chosen in this order:

1. HTTP, `POST /admin/reload` (the default): the answer is the diff the server applied
   (added, removed, changed, needs_restart) or the problems that made it keep the old
   config. The URL is `--url`, else `$CORRAL_URL`, else the config's [server] host and
   port (a wildcard host means this machine's loopback; https when tls_cert is set, the
   certificate itself trusted besides the system's CAs). The admin key, where one is
   needed, comes from `$CORRAL_ADMIN_KEY` or `--admin-key-file`, never the command line,
   where `ps` would show it.
2. SIGHUP to the pid in `[server] pid_file`: with `--signal`, or when the server cannot be
   reached over HTTP (a connection refused, not an HTTP error: a 401 is a wrong key, and
   signalling around it would hide that). A signal has no answer; when the server can be
   reached, the report comes from its `GET /admin/events` stream (the `reload` or
   `config_error` event it publishes), subscribed to before the signal is sent.

Stdlib urllib only: this runs once per command, and the router's dependencies carry no
HTTP client.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.admin_target import KEY_ENV, URL_ENV, read_key, refused_hint, url_from_server
from router.server import json_text
from supervisor import pid_file
from supervisor.config import Config, listen_hosts

ENV_URL, ENV_ADMIN_KEY = URL_ENV, KEY_ENV
_MAX_ANSWER = 1 << 20  # an answer is a few names; --url may point anywhere


class ReloadError(Exception):
    """The server did not reload; the message says why (never quoting a key)."""


class Unreachable(ReloadError):
    """Nothing answered at the URL (connection refused, no route, timed out)."""


@dataclass(frozen=True)
class Target:
    url: str
    admin_key: str | None = field(default=None, repr=False)
    cafile: str | None = None
    pid_file: str | None = None
    settle: float = 0.5  # the server's reload_settle: how long a reload takes at least


def target(cfg: Config, url: str | None, admin_key_file: str | None) -> Target:
    """Where and how to reach the server that runs `cfg`. Raises ReloadError for an
    unreadable key file."""
    srv = cfg.server
    url = url or os.environ.get(ENV_URL) or url_from_server(
        {"host": listen_hosts(srv)[0], "port": srv.port, "tls_cert": srv.tls_cert}
    )
    try:
        key = read_key(admin_key_file, os.environ)
    except ValueError as exc:
        raise ReloadError(str(exc)) from None
    return Target(url.rstrip("/"), key, srv.tls_cert, srv.pid_file, cfg.supervisor.reload_settle)


def _open(t: Target, method: str, route: str, timeout: float) -> Any:
    """The response to one request. Raises Unreachable where no connection could be made
    (and only then: a server that accepted and then said nothing in time must not be
    signalled a second time), ReloadError for anything else."""
    headers = {"Accept": "application/json"}
    if t.admin_key is not None:
        headers["Authorization"] = f"Bearer {t.admin_key}"
    req = urllib.request.Request(t.url + route, method=method, headers=headers, data=b"" if method == "POST" else None)
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]  # no http_proxy for our own server
    if t.url.startswith("https:"):
        # The system's CAs ($SSL_CERT_FILE included), and the server's own certificate,
        # which a self-signed one needs.
        ctx = ssl.create_default_context()
        if t.cafile is not None:
            try:
                ctx.load_verify_locations(cafile=t.cafile)
            except (OSError, ssl.SSLError):
                pass  # not readable here, or no certificate in it: the system's CAs decide
        handlers.append(urllib.request.HTTPSHandler(context=ctx))
    opener = urllib.request.build_opener(*handlers)
    try:
        return opener.open(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        hint = refused_hint(exc.code, t.admin_key is not None, signal=True)
        raise ReloadError(f"{t.url}{route}: {exc.code} {_message(exc.read(_MAX_ANSWER))}{hint}") from None
    except urllib.error.URLError as exc:  # raised while connecting and sending
        if isinstance(exc.reason, OSError) and not isinstance(exc.reason, ssl.SSLError):
            raise Unreachable(f"{t.url}: cannot connect ({exc.reason})") from None
        raise ReloadError(f"{t.url}: {exc.reason}") from None
    except OSError as exc:  # connected, then no answer or a broken one
        raise ReloadError(f"{t.url}{route}: no answer ({exc})") from None


def _message(body: bytes) -> str:
    """An OpenAI error envelope's message, else the body's start."""
    try:
        return str(json_text.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


def post_reload(t: Target, timeout: float | None = None) -> dict[str, list[str]]:
    """POST /admin/reload; the diff the server applied. Blocks for the server's
    reload_settle at least. Raises Unreachable, or ReloadError with the server's reasons."""
    # The server answers once the file has settled, which takes a few reload_settles.
    timeout = timeout or max(60.0, 3 * t.settle + 30)
    with _open(t, "POST", "/admin/reload", timeout) as r:
        try:
            answer: dict[str, list[str]] = json_text.loads(r.read(_MAX_ANSWER))
        except (OSError, ValueError) as exc:
            raise ReloadError(f"{t.url}/admin/reload: no readable answer ({exc})") from None
    return answer


def send_sighup(t: Target) -> int:
    """SIGHUP to the pid in the pid file; the pid. Raises ReloadError."""
    if t.pid_file is None:
        raise ReloadError("no [server] pid_file in the config: cannot signal the server")
    try:
        pid = pid_file.read_live(Path(t.pid_file))
    except pid_file.PidFileError as exc:
        raise ReloadError(str(exc)) from None
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        raise ReloadError(f"cannot signal process {pid}: {exc.strerror}") from None
    return pid


def signal_and_watch(t: Target, timeout: float = 60.0) -> tuple[int, dict[str, Any] | None]:
    """SIGHUP, reported from the server's event stream where it can be read: the pid, and
    the `reload` or `config_error` event that followed (None: no stream, or none in time).
    Raises ReloadError if no signal could be sent."""
    try:
        stream = _open(t, "GET", "/admin/events", timeout=max(5.0, t.settle + 5))
    except ReloadError:
        return send_sighup(t), None
    with stream:
        pid = send_sighup(t)
        deadline = time.monotonic() + timeout
        kind = ""
        try:
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: ") and kind in ("reload", "config_error"):
                    event: dict[str, Any] = json_text.loads(line.removeprefix("data: "))
                    return pid, event
                if time.monotonic() > deadline:
                    break
        except (OSError, ValueError):
            pass
    return pid, None


def reload(t: Target, use_signal: bool) -> tuple[str, dict[str, Any] | None]:
    """Reload by the rules in this module's docstring: how it was done (a line for the
    operator), and the diff or config_error event (None when nothing can say). Raises
    ReloadError."""
    if not use_signal:
        try:
            return f"POST {t.url}/admin/reload", post_reload(t)
        except Unreachable as exc:
            if t.pid_file is None:
                raise ReloadError(f"{exc}; and no [server] pid_file to signal instead") from None
            pid = send_sighup(t)
            return f"{exc}; sent SIGHUP to pid {pid} ({t.pid_file}) instead", None
    pid, event = signal_and_watch(t)
    return f"sent SIGHUP to pid {pid} ({t.pid_file})", event
