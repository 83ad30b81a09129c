"""`corral status|load|unload|reset|reload`: see and steer a running server through its
/admin routes (router/server/admin.py).

Where the server is: --url, else the [server] host and port of --config, else
$CORRAL_URL, else the config file the search path finds, else http://127.0.0.1:8080.
The admin key comes from --admin-key-file or $CORRAL_ADMIN_KEY, never from an argument,
which any user could read in `ps`. Plain urllib, synchronous: one request per command
(unload's wait polls), so a client library would buy nothing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import shutil
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral import admin_target as at
from corral.status_table import render, render_fleet
from router.server import json_text
from supervisor.config import search as config_search
from supervisor.config import ConfigError

if TYPE_CHECKING:
    from corral.args import Subparsers


class Exit(Exception):
    """Ends a command with an exit code and a message for stderr."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib would send the admin key on to wherever a redirect points, another host
    # included; a redirect is answered as the 3xx it is instead.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


# No ProxyHandler from the environment: an http_proxy set for the internet would otherwise
# carry admin calls, key included, to the proxy.
_opener = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Server:
    url: str
    key: str | None
    timeout: float

    def call(self, method: str, path: str) -> tuple[int, Any]:
        """The status and the decoded JSON body of one request. Raises Exit for no
        connection, no answer in time, or an answer that is not JSON."""
        headers = {"accept": "application/json"}
        if self.key is not None:
            headers["authorization"] = f"Bearer {self.key}"
        req = urllib.request.Request(
            self.url + path, method=method, headers=headers, data=b"" if method == "POST" else None
        )
        try:
            with _opener.open(req, timeout=self.timeout) as r:
                status, raw, location = r.status, r.read(), None
        except urllib.error.HTTPError as exc:  # an answer, with a status that is not 2xx
            status, raw, location = exc.code, exc.read(), exc.headers.get("location")
        except TimeoutError:
            raise Exit(at.UNREACHABLE, f"{self.url}: no answer within {self.timeout:g} s (--timeout)") from None
        except urllib.error.URLError as exc:
            raise Exit(at.UNREACHABLE, f"cannot reach {self.url}: {exc.reason}") from None
        except http.client.HTTPException as exc:  # something listens there, but not HTTP
            raise Exit(at.UNREACHABLE, f"{self.url}: not an HTTP answer ({type(exc).__name__} {str(exc).strip()!r})") from None
        except OSError as exc:
            raise Exit(at.UNREACHABLE, f"cannot reach {self.url}: {exc}") from None
        if 300 <= status < 400:
            raise Exit(at.FAILED, f"{self.url}{path}: HTTP {status}, redirected to {location}; not followed, as it would take the admin key along")
        try:
            return status, json_text.loads(raw)
        except ValueError:
            snippet = raw[:200].decode("utf-8", "replace")
            raise Exit(at.FAILED, f"{self.url}{path}: HTTP {status}, not JSON (is this a Corral server?): {snippet!r}") from None

    def admin(self, method: str, path: str) -> Any:
        """The body of a successful answer; anything else raises Exit with the server's
        own message and the exit code its status means."""
        status, body = self.call(method, path)
        code = at.exit_code(status, _error_field(body, "code"))
        if code != at.OK:
            message = _error_field(body, "message") or f"HTTP {status}"
            raise Exit(code, f"{method} {path}: {message}{at.refused_hint(status, self.key is not None)}")
        return body


def _error_field(body: Any, field: str) -> Any:
    error = body.get("error") if isinstance(body, dict) else None
    return error.get(field) if isinstance(error, dict) else None


def _model_path(name: str, action: str = "") -> str:
    # Quoted whole: a name may hold `/`, `?` or `#`; the router decodes %2F back to `/`.
    return f"/admin/models/{urllib.parse.quote(name, safe='')}" + (f"/{action}" if action else "")


# ---- where the server is -------------------------------------------------------------


def _url_from_config(path: str, how: str) -> str:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        return at.url_from_server(data.get("server"))
    except (OSError, tomllib.TOMLDecodeError, ValueError) as exc:
        raise Exit(at.USAGE, f"{path} ({how}): cannot tell the server's address from it: {exc}; give --url") from None


def find_url(args: argparse.Namespace, env: dict[str, str]) -> str:
    if args.url:
        if len(args.url) > 1:
            raise ValueError(f"give one --url: only `corral status` takes several ({len(args.url)} given)")
        return at.check_url(args.url[0])
    if args.config is not None:
        return _url_from_config(args.config, "--config")
    if named := env.get(at.URL_ENV):
        return at.check_url(named)
    try:
        path, how = config_search.find(None, env)
    except ConfigError:
        return at.DEFAULT_URL
    url = _url_from_config(str(path), how)
    # As every command says which file it found: a stray ./corral.toml would otherwise
    # steer another server without a word.
    print(f"corral: {url}, from {path} ({how})", file=sys.stderr)
    return url


def find_key(args: argparse.Namespace, env: dict[str, str]) -> str | None:
    try:
        return at.read_key(args.admin_key_file, env)
    except ValueError as exc:
        raise Exit(at.USAGE, str(exc)) from None


# ---- the commands ------------------------------------------------------------------------


def common_options() -> argparse.ArgumentParser:
    """The options every command that calls a running server takes (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", action="append",
        help=f"the server's base URL (default: from the config, ${at.URL_ENV}, or {at.DEFAULT_URL}); "
        "`status` takes several, one table for them all",
    )
    common.add_argument(
        "--config", metavar="FILE",
        help=f"read the server's host and port from this config file (default: ${config_search.ENV} and the search path)",
    )
    common.add_argument(
        "--admin-key-file", metavar="FILE",
        help=f"a file holding the admin key (default: ${at.KEY_ENV}; none is needed on loopback with no admin_keys)",
    )
    common.add_argument("--timeout", type=_seconds, metavar="SECONDS", help="how long to wait for the server")
    return common


def add(sub: Subparsers) -> None:
    common = common_options()

    def parser(name: str, help: str, run: Any, timeout: float) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name, help=help, description=help, parents=[common], epilog=at.EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(run=run, default_timeout=timeout)
        return p

    s = parser("status", "show what every model of the running server is doing", status, 10)
    s.add_argument("--json", action="store_true", help="print GET /admin/models's JSON as it is")
    s.add_argument(
        "--fleet", action="store_true",
        help="the server and the servers of its [server] fleet, one table for them all (GET /admin/fleet)",
    )
    p = parser("load", "load a model now; returns once it is ready", load, 900)
    p.add_argument("name", help="the model (or an alias)")
    p = parser("unload", "unload a model, letting requests in flight finish", unload, 60)
    p.add_argument("name", help="the model (or an alias)")
    p.add_argument("--force", action="store_true", help="cancel the model's requests in flight instead")
    p.add_argument("--no-wait", action="store_true", help="return once the unload has begun")
    p = parser("reset", "let a failed model load again on its next request", reset, 30)
    p.add_argument("name", help="the model (or an alias)")
    parser("reload", "re-read the server's config file and print what changed", reload, 120)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def _width() -> int:
    """The terminal's width; piped into a file or grep, every row whole ($COLUMNS still
    rules, as in `ls`)."""
    return shutil.get_terminal_size((10_000, 24)).columns


def run_with_server(args: argparse.Namespace, command: Any) -> int:
    """A command's common frame: find the server and key, run, turn Exit into a code."""
    try:
        timeout = args.timeout if args.timeout is not None else args.default_timeout
        env = dict(os.environ)
        try:
            server = Server(find_url(args, env), find_key(args, env), timeout)
        except ValueError as exc:
            raise Exit(at.USAGE, str(exc)) from None
        return int(command(server, args))
    except BrokenPipeError:
        # `corral status | head -3`: the reader has what it wanted. Point stdout at
        # /dev/null so that the interpreter's own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return at.OK
    except Exit as exc:
        print(f"corral {args.command}: {exc.message}", file=sys.stderr)
        return exc.code


def status(args: argparse.Namespace) -> int:
    if args.url and len(args.url) > 1:
        return _fleet_status(args)

    def run(server: Server, args: argparse.Namespace) -> int:
        body = server.admin("GET", "/admin/models")
        if args.fleet:
            return _print_fleet(args, [(server.url, body), *_fleet_of(server)])
        if args.json:
            print(json.dumps(body, indent=2))
            return at.OK
        try:
            print(render(body, _width(), time.time()))
        except ValueError as exc:
            raise Exit(at.FAILED, f"{server.url}: {exc}") from None
        return at.OK

    return run_with_server(args, run)


def _fleet_status(args: argparse.Namespace) -> int:
    """`corral status --url A --url B ...`: every server asked at once, one table of their
    models with a HOST column; a server that does not answer is a line above it, and the
    exit code is the first failure's (the others are still shown)."""
    try:
        urls = list(dict.fromkeys(at.check_url(u) for u in args.url))
        key = find_key(args, dict(os.environ))
    except ValueError as exc:
        print(f"corral status: {exc}", file=sys.stderr)
        return at.USAGE
    except Exit as exc:
        print(f"corral status: {exc.message}", file=sys.stderr)
        return exc.code
    timeout = args.timeout if args.timeout is not None else args.default_timeout

    def ask(url: str) -> tuple[dict[str, Any] | str, int]:
        try:
            body = Server(url, key, timeout).admin("GET", "/admin/models")
        except Exit as exc:
            return exc.message, exc.code
        if not isinstance(body, dict):
            return "the answer is not a JSON object: is this a Corral server?", at.FAILED
        return body, at.OK

    with ThreadPoolExecutor(max_workers=min(len(urls), 16)) as pool:
        answers = list(pool.map(ask, urls))
    _print_fleet(args, [(url, body) for url, (body, _) in zip(urls, answers)])
    return next((code for _, code in answers if code != at.OK), at.OK)


def _fleet_of(server: Server) -> list[tuple[str, dict[str, Any] | str]]:
    """The servers of the server's [server] fleet, as it asked them (GET /admin/fleet)."""
    body = server.admin("GET", "/admin/fleet")
    hosts = body.get("hosts") if isinstance(body, dict) else None
    if not isinstance(hosts, list):
        raise Exit(at.FAILED, f"{server.url}: GET /admin/fleet did not answer a fleet")
    return [
        (str(h.get("url", "?")), str(h["error"]) if "error" in h else h) for h in hosts if isinstance(h, dict)
    ]


def _print_fleet(args: argparse.Namespace, bodies: list[tuple[str, dict[str, Any] | str]]) -> int:
    if args.json:
        hosts = [{"url": u, **b} if isinstance(b, dict) else {"url": u, "error": b} for u, b in bodies]
        print(json.dumps({"hosts": hosts}, indent=2))
    else:
        print(render_fleet(bodies, _width(), time.time()))
    return at.OK


def _describe(model: Any) -> str:
    m = model if isinstance(model, dict) else {}
    line = f"{m.get('name', '?')}: {m.get('state', '?')}"
    if m.get("state") == "ready":  # load_seconds outlives the worker; it means nothing then
        seconds = m.get("load_seconds")
        took = f", loaded in {seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
        line += f" (pid {m.get('pid')}{took})"
    return line


def load(args: argparse.Namespace) -> int:
    def run(server: Server, args: argparse.Namespace) -> int:
        body = server.admin("POST", _model_path(args.name, "load"))
        print(_describe(body.get("model")))
        return at.OK

    return run_with_server(args, run)


def unload(args: argparse.Namespace) -> int:
    def run(server: Server, args: argparse.Namespace) -> int:
        path = _model_path(args.name, "unload") + ("?force=true" if args.force else "")
        model = server.admin("POST", path).get("model", {})
        # Wait on the model's own name: an alias resolves to it, and stays valid.
        deadline = time.monotonic() + server.timeout
        while not args.no_wait and model.get("state") not in ("stopped", "failed"):
            if time.monotonic() >= deadline:
                raise Exit(at.FAILED, f"{model.get('name')}: still {model.get('state')} after {server.timeout:g} s (--timeout)")
            time.sleep(0.1)
            model = server.admin("GET", _model_path(str(model.get("name", args.name)))).get("model", {})
        print(_describe(model))
        return at.OK

    return run_with_server(args, run)


def reset(args: argparse.Namespace) -> int:
    def run(server: Server, args: argparse.Namespace) -> int:
        body = server.admin("POST", _model_path(args.name, "reset"))
        what = "reset; it loads again on its next request" if body.get("reset") else "was not failed; nothing to reset"
        print(f"{_describe(body.get('model'))}: {what}")
        return at.OK

    return run_with_server(args, run)


def reload(args: argparse.Namespace) -> int:
    def run(server: Server, args: argparse.Namespace) -> int:
        status, body = server.call("POST", "/admin/reload")
        if status == 400 and _error_field(body, "code") == "invalid_config":
            problems = _error_field(body, "problems") or [_error_field(body, "message")]
            for problem in problems:
                print(problem, file=sys.stderr)
            raise Exit(at.FAILED, "the new config is invalid; the server runs on with its old one")
        code = at.exit_code(status, _error_field(body, "code"))
        if code != at.OK:
            message = _error_field(body, "message") or f"HTTP {status}"
            raise Exit(code, f"POST /admin/reload: {message}{at.refused_hint(status, server.key is not None)}")
        for line in at.reload_lines(body):
            print(line)
        return at.OK

    return run_with_server(args, run)
