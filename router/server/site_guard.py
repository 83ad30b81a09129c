"""Which web pages and which host names may reach Corral at all: the answer to cross-site
requests and DNS rebinding (issue 20, item 5).

A browser lets any page send a "simple" request (a POST with `Content-Type: text/plain`, a
form) to any address, the operator's own loopback included, with no preflight: the page
cannot read the answer, but the request is carried out. With no key configured, a page the
operator opens could so load and unload models, reload the config and burn the CPU. Such a
request always carries the page's `Origin`; so does every cross-origin fetch. So:

- a request whose `Origin` is present and is neither the server's own origin (the
  dashboard's, from the `Host` it was reached by) nor listed in `[server] cors_origins` is
  refused with 403 before anything else runs. `Origin: null` (sandboxed frames, file://
  pages, some redirects) is nobody's origin, so it is refused too. Requests without
  `Origin` (curl, SDKs, `corral chat`, same-origin GETs and navigations) pass.
- DNS rebinding makes a page's own origin resolve to 127.0.0.1: then `Origin` and `Host`
  agree, and the page can read every answer. What gives it away is the name in `Host`. So,
  while no API key is configured (keys stop a page, which does not have one), a request
  whose `Host` is not a loopback name or address, the address the server is bound to, or a
  name in `[server] allowed_hosts` is refused with 403. Ollama fixed CVE-2024-28224 the
  same way (server/routes.go, allowedHostsMiddleware, which also admits *.localhost).

Both lists are read from the config at each request, so a reload applies them. The
decisions are pure functions; `install` is the hook.
"""

from __future__ import annotations

import ipaddress
from typing import Sequence

from quart import request
from quart_trio import QuartTrio

from supervisor.config import listen_hosts
from supervisor.errors import Forbidden
from supervisor.supervisor import Supervisor

_DEFAULT_PORTS = {"http": 80, "https": 443}

# (scheme, host, port): an origin as browsers compare them.
Origin = tuple[str, str, int]


def split_host(value: str) -> tuple[str, int | None] | None:
    """A `Host` header's name (lower case, no trailing dot, IPv6 without brackets) and port;
    None when it is not a host at all."""
    value = value.strip()
    if not value or any(c.isspace() or c in "/@?#\\" for c in value):
        return None
    port: int | None = None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                return None
            port = _port(rest[1:])
            if port is None:
                return None
    else:
        name, sep, p = value.rpartition(":")
        if not sep:
            name = p
        elif ":" in name:  # a bare IPv6 address has no port
            name = value
        else:
            port = _port(p)
            if port is None:
                return None
    name = name.lower().rstrip(".")
    return (name, port) if name else None


def _port(text: str) -> int | None:
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None


def is_loopback_name(name: str) -> bool:
    """localhost and its subdomains (RFC 6761 keeps them on this machine), and loopback
    addresses."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def host_allowed(host: str | None, allowed_hosts: Sequence[str], *bound: str) -> bool:
    """Whether a request that reached the server by the name `host` may be served while no
    API key is configured. `bound`: the addresses the server listens on, which clients on
    the network may name (only each that is one address, not every interface)."""
    if "*" in allowed_hosts:
        return True
    if host is None:
        return True  # HTTP/1.0 without Host: no browser sends that
    parsed = split_host(host)
    if parsed is None:
        return False
    name = parsed[0]
    if is_loopback_name(name):
        return True
    for address in bound:
        listening = address.strip("[]").lower().rstrip(".")
        if listening and listening not in ("0.0.0.0", "::") and name == listening:
            return True
    for entry in allowed_hosts:
        e = entry.lower().strip("[]").rstrip(".")
        # ".example.com" admits the name and every name under it.
        if name == e or (e.startswith(".") and (name == e[1:] or name.endswith(e))):
            return True
    return False


def parse_origin(value: str) -> Origin | None:
    """An `Origin` header (or a cors_origins entry) as (scheme, host, port); None for
    "null" and anything that is not scheme://host[:port]."""
    scheme, sep, rest = value.strip().partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS or not rest or rest.endswith("/"):
        return None
    parsed = split_host(rest)
    if parsed is None:
        return None
    name, port = parsed
    return scheme, name, port if port is not None else _DEFAULT_PORTS[scheme]


def own_origin(scheme: str, host: str | None, forwarded_proto: str | None = None,
               forwarded_host: str | None = None) -> Origin | None:
    """The origin of a page this server served, reached as `host` over `scheme`, or as a
    reverse proxy in front says it was reached (X-Forwarded-Proto, X-Forwarded-Host: the
    dashboard behind nginx's TLS is an https page). A page cannot forge these: they are
    not headers a browser lets a page send without a preflight, and a preflight from a
    foreign page is refused."""
    if forwarded_proto:
        proto = forwarded_proto.split(",")[0].strip().lower()
        scheme = proto if proto in _DEFAULT_PORTS else scheme
    if forwarded_host:
        host = forwarded_host.split(",")[0]
    if host is None:
        return None
    return parse_origin(f"{scheme}://{host.strip()}")


def origin_allowed(origin: str, cors_origins: Sequence[str], own: Origin | None) -> bool:
    """Whether a request sent by a page of `origin` may be served. A cors_origins entry is
    "*" (any page), an origin (scheme://host[:port], that one alone), or a host pattern
    as llama-server's --cors-origins takes one: "localhost" (any loopback page: localhost,
    127.0.0.1, [::1], any scheme and port), a name ("chat.example", any scheme and port)
    or ".example.com" (that name and every name under it)."""
    if "*" in cors_origins:
        return True
    parsed = parse_origin(origin)
    if parsed is None:
        return False
    if own is not None and parsed == own:
        return True
    return any(_origin_matches(parsed, entry) for entry in cors_origins)


def _origin_matches(origin: Origin, entry: str) -> bool:
    if "://" in entry:
        return parse_origin(entry) == origin
    name = origin[1].strip("[]")
    e = entry.lower().strip("[]").rstrip(".")
    if e == "localhost":
        return name in ("localhost", "127.0.0.1", "::1")
    return name == e or (e.startswith(".") and (name == e[1:] or name.endswith(e)))


def install(app: QuartTrio, supervisor: Supervisor) -> None:
    """Refuse cross-site and rebound requests before any other hook or route runs
    (registered first: before CORS preflights, keys and bodies)."""

    @app.before_request
    async def guard() -> None:
        server = supervisor.config.server
        # Quart puts Host: "" on a request that had none (HTTP/1.0); only the raw headers
        # tell that from a Host header sent empty, which is refused.
        sent = any(name == b"host" for name, _ in request.scope.get("headers", ()))
        host = request.headers.get("host") if sent else None
        origin = request.headers.get("origin")
        if request.method == "OPTIONS" and "access-control-request-method" in request.headers:
            origin = None  # a preflight does nothing: router/server/cors.py answers it, allowed or not
        own = own_origin(
            request.scheme, host, request.headers.get("x-forwarded-proto"), request.headers.get("x-forwarded-host")
        )
        if origin is not None and not origin_allowed(origin, server.cors_origins, own):
            raise Forbidden(
                f"requests from the web page at {origin[:200]!r} are not allowed: only this server's "
                "own pages and the origins in [server] cors_origins may call it",
                param="Origin",
            )
        if not supervisor.config.keys.api_keys_required and not host_allowed(host, server.allowed_hosts, *listen_hosts(server)):
            shown = (host or "")[:200]
            raise Forbidden(
                f"this server is not reached as {shown!r}: with no API key configured it answers "
                "only loopback names (localhost, 127.0.0.1, [::1]), the address it listens on, and "
                "the names in [server] allowed_hosts",
                param="Host",
            )
