"""Pure decisions behind `corral status/load/unload/reset/reload` (corral/admin_commands.py):
which URL the server is at, whether an admin key is usable, what an answer's status means
as an exit code, and a reload's diff as lines."""

from __future__ import annotations

import ipaddress
import urllib.parse
from typing import Any, Mapping

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "CORRAL_URL"
KEY_ENV = "CORRAL_ADMIN_KEY"

# Exit codes a script can act on; the commands' help and docs/cli.md list them.
OK = 0
FAILED = 1  # understood, but it did not work: a load that failed, an invalid config
USAGE = 2  # argparse's own, and any other bad argument (a malformed --url, an empty key file)
UNREACHABLE = 3  # no connection, or no answer within --timeout
REFUSED = 4  # 401/403: the admin key is missing, wrong, or not an admin key
NO_MODEL = 5  # 404: no model (or alias) of that name

EXIT_CODES_HELP = f"""exit codes:
  {OK}  ok
  {FAILED}  the server understood but the command failed (a load that failed, an invalid config on reload)
  {USAGE}  usage error (bad arguments, an unreadable or empty --admin-key-file, a malformed --url)
  {UNREACHABLE}  cannot reach the server, or no answer within --timeout
  {REFUSED}  refused: the admin key is missing or wrong (401/403)
  {NO_MODEL}  no such model (404)"""


def check_url(url: str) -> str:
    """The base URL without a trailing slash; ValueError says what is wrong with it."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url!r} is not an http:// or https:// URL (for example {DEFAULT_URL})")
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: give the server's base URL, without ?query or #fragment")
    try:
        parts.port  # raises for a port that is not a number or out of range
    except ValueError as exc:
        raise ValueError(f"{url!r}: {exc}") from None
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def url_from_server(server: object) -> str:
    """The URL of a server configured by this [server] table (parsed TOML). A wildcard
    address is reached on loopback. Read leniently: the file may be one the server itself
    refused (the very reason to run `corral reload`), so only host, port and tls_cert
    matter here; a value of the wrong type raises ValueError."""
    table: dict[str, Any] = server if isinstance(server, dict) else {}
    host = table.get("host", "127.0.0.1")
    port = table.get("port", 8080)
    if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
        raise ValueError("[server] host must be a string and port an integer")
    if not 0 < port <= 65535:
        raise ValueError(f"[server] port {port} cannot be connected to (1..65535)")
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None  # a name such as localhost
    if address is not None and address.is_unspecified:
        host = "::1" if address.version == 6 else "127.0.0.1"
    elif host == "":
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    scheme = "https" if table.get("tls_cert") else "http"
    return f"{scheme}://{host}:{port}"


def check_key(text: str, where: str) -> str:
    """An admin key as read from a file or the environment: one line, trimmed. ValueError
    names `where`, never the key."""
    key = text.strip()
    if not key:
        raise ValueError(f"{where} is empty")
    if any(c.isspace() or not c.isprintable() for c in key) or not key.isascii():
        raise ValueError(f"{where} must hold one key: printable ASCII, no spaces, on one line")
    return key


def read_key(key_file: str | None, env: Mapping[str, str]) -> str | None:
    """The admin key from `--admin-key-file`, else `$CORRAL_ADMIN_KEY`, else None (a
    server with no admin keys answers loopback clients without one). ValueError names
    where it looked, never the key."""
    if key_file is not None:
        try:
            with open(key_file, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--admin-key-file: cannot read {key_file}: {exc}") from None
        return check_key(text, f"--admin-key-file {key_file}")
    if (from_env := env.get(KEY_ENV)) is not None:
        return check_key(from_env, f"${KEY_ENV}")
    return None


def exit_code(status: int, error_code: object) -> int:
    """The exit code for an HTTP answer's status (and its error `code`, if any)."""
    if 200 <= status < 300:
        return OK
    if status in (401, 403):
        return REFUSED
    if status == 404 and error_code == "model_not_found":
        return NO_MODEL
    return FAILED


def refused_hint(status: int, key_sent: bool, signal: bool = False) -> str:
    """What to add to the server's own words when it refused an admin call: where the
    command reads an admin key from, when it sent none (a server with API keys answers
    /admin only to an admin key, loopback clients included), and, for a reload, the way
    around HTTP (SIGHUP, which needs no key). Empty for any other answer."""
    if status not in (401, 403) or key_sent:
        return ""
    hint = f" (no admin key was sent: put one of the server's [server] admin_keys in ${KEY_ENV} or a file for --admin-key-file"
    if signal:
        hint += "; or reload by SIGHUP: --signal, with [server] pid_file set"
    return hint + ")"


def reload_lines(diff: dict[str, Any]) -> list[str]:
    """POST /admin/reload's answer as the lines `corral reload` prints."""
    lines = []
    for key, label in (("added", "added"), ("removed", "removed"), ("changed", "changed"),
                       ("upstreams_added", "added upstream"), ("upstreams_removed", "removed upstream"),
                       ("upstreams_changed", "changed upstream"), ("needs_restart", "needs restart")):
        names = diff.get(key)
        if names:
            lines.append(f"{label}: {', '.join(str(n) for n in names)}")
    if not lines:
        lines.append("no changes")
    unchanged = diff.get("unchanged")
    if unchanged:
        lines.append(f"unchanged: {', '.join(str(n) for n in unchanged)}")
    unloadable = diff.get("unloadable")
    if isinstance(unloadable, dict):
        # Served as failed while the rest of the file runs: say so, or nobody notices.
        lines += [f"cannot load: {problem}" for problem in unloadable.values()]
    return lines
