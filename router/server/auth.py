"""Who may use which route and which model: API keys, admin keys, loopback.

Three kinds of route:
- `/health` is open, so that load balancers and systemd checks need no key, and so is the
  dashboard's page at `/` (static, it holds no data; a browser sends no header with a page
  navigation, so a page behind the key could never open): its script calls the routes
  below with the key;
- `/admin/*` and `/metrics` need an admin key. With no key configured at all (one user),
  they answer clients on loopback only (behind a reverse proxy every client is loopback:
  configure admin keys there); once API keys are configured, they answer no one until
  `admin_keys` are too, since on a shared host every local user is a loopback client
  (`public_metrics` opens /metrics alone);
- everything else (the OpenAI and llama-server routes, `/openapi.json`, and addresses that
  match no route, so that an unauthenticated client cannot even map the routes) needs an
  API or admin key once any API key is configured.

A key limited to some models sees only those: every other model answers as a model that
does not exist, so a key cannot probe the config. The decision (`authorize`) is pure; the
hook around it reads the request and keeps the key in `g` for the request's later steps.
"""

from __future__ import annotations

import ipaddress
from enum import Enum
from typing import Callable

from quart import g, has_app_context, request
from quart_trio import QuartTrio

from router.server import access_log, adapter_scales
from supervisor.errors import Forbidden, Unauthorized
from supervisor.group import Served
from supervisor.config.keys import Key, Keyring
from supervisor.config.lora_views import LoraView
from supervisor.supervisor import Supervisor, no_model, unknown_model


class Access(Enum):
    OPEN = "open"
    API = "api"
    ADMIN = "admin"


def access_of(path: str, public_metrics: bool = False, method: str = "GET") -> Access:
    if path in ("/health", "/v1/health", "/") or (public_metrics and path == "/metrics"):
        return Access.OPEN
    if path == "/metrics" or path == "/admin" or path.startswith("/admin/"):
        return Access.ADMIN
    if path == "/lora-adapters" and method == "POST":  # every key's requests decode under its scales
        return Access.ADMIN
    return Access.API


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request sends: `Authorization: Bearer KEY` (the openai clients), or
    `x-api-key: KEY` (Anthropic-style clients and some proxies)."""
    if authorization is not None:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    if x_api_key is not None and x_api_key.strip():
        return x_api_key.strip()
    return None


MISSING = "You didn't provide an API key. Send it as `Authorization: Bearer KEY` or `x-api-key: KEY`."
INCORRECT = "Incorrect API key provided."
NO_ADMIN_KEYS = (
    "/admin, /metrics and POST /lora-adapters need an admin key, and this server has API keys but no admin key: "
    "set [server] admin_keys and send one (corral's commands read it from $CORRAL_ADMIN_KEY "
    "or --admin-key-file); [server] public_metrics = true opens /metrics alone."
)


def authorize(ring: Keyring, access: Access, presented: str | None, loopback: bool) -> Key | None:
    """The key a request acts with (None: it needs none, and sent none that matches).
    Raises Unauthorized or Forbidden."""
    key = ring.match(presented) if presented is not None else None
    if access is Access.OPEN:
        # Anyone may call it; a configured key sent anyway is still the caller's (an admin
        # key's scrape of a public /metrics sees the per-key series), a wrong one is ignored.
        return key
    if access is Access.ADMIN:
        if not ring.admin_keys_configured:
            if ring.api_keys_required:
                raise Forbidden(NO_ADMIN_KEYS)
            if not loopback:
                raise Forbidden("/admin, /metrics and POST /lora-adapters answer loopback clients only while no key is configured.")
            return key
        if key is None:
            raise Unauthorized(INCORRECT if presented is not None else MISSING)
        if not key.admin:
            raise Forbidden("This key is not an admin key: /admin, /metrics and POST /lora-adapters need one.")
        return key
    if key is None and ring.api_keys_required:
        raise Unauthorized(INCORRECT if presented is not None else MISSING)
    # Without required keys, a key the client sends anyway (the openai client always sends
    # one) is ignored unless it is configured.
    return key


def is_loopback(address: str | None) -> bool:
    """Whether a peer address is on this machine's loopback. No address at all is a Unix
    socket or an in-process client: local too."""
    if not address:
        return True
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def current_key() -> Key | None:
    """The key of the request being served (None: no key, or no request: `corral chat`
    runs generations in its own process)."""
    if not has_app_context():
        return None
    key: Key | None = g.get("corral_key")
    return key


def scoped_resolve(supervisor: Supervisor, scales: adapter_scales.Scales | None = None) -> Callable[[str | None], Served]:
    """supervisor.resolve, as the current request's key sees the models: one outside its
    scope answers exactly as one that does not exist. An adapter model resolves to its
    base's handle, under its own name for keys, and is remembered with its adapters for
    the request's generation (router/server/adapter_scales.py)."""

    def resolve(model: str | None) -> Served:
        handle = supervisor.resolve(model)
        config = supervisor.config
        view = config.lora_view(model) if model is not None else None
        if view is None or view.model != handle.name:
            view = config.lora.get(handle.name)
        served = view.name if view is not None and view.adapter_model else handle.name
        key = current_key()
        if key is not None and not key.may_use(served):
            raise no_model() if model is None else unknown_model(model)
        if (record := access_log.current()) is not None:
            record.model = served
        adapter_scales.remember(view, (scales or adapter_scales.Scales()).of(view) if view is not None else ())
        return handle

    return resolve


def adapter_models(supervisor: Supervisor) -> list[tuple[LoraView, Served]]:
    """The adapter models (`base =`) the current request's key may see, each with the
    handle of the model whose worker serves it (for /v1/models and /api/tags)."""
    key = current_key()
    out = []
    for view in supervisor.config.lora.values():
        handle = supervisor.handles.get(view.model)
        if view.adapter_model and handle is not None and (key is None or key.may_use(view.name)):
            out.append((view, handle))
    return out


def visible(handle: Served) -> bool:
    """Whether the current request's key may see `handle` (in /v1/models)."""
    key = current_key()
    return key is None or key.may_use(handle.name)


def install(app: QuartTrio, supervisor: Supervisor) -> None:
    """Check every request before its route runs. Keys are read from the supervisor's
    config at each request, so a reload's keys apply at once."""

    @app.before_request
    async def check_key() -> None:
        key = g.corral_key = authorize(
            supervisor.config.keys,
            access_of(request.path, supervisor.config.server.public_metrics, request.method),
            presented_key(request.headers.get("authorization"), request.headers.get("x-api-key")),
            # Quart's request.remote_addr comes from a Remote-Addr header it sets first
            # and the client's own headers then join: one reordering away from a client
            # naming its own address. The scope's peer cannot be forged.
            is_loopback(access_log.peer(request.scope)),
        )
        if key is not None and (record := access_log.current()) is not None:
            record.key, record.key_id = key.name, key.owner


def refuse_bind(host: str, ring: Keyring, allow_insecure_bind: bool) -> str | None:
    """Why `corral serve` must not listen on `host` (None: it may). Any address other
    than loopback, with no API key, lets every host that reaches the port generate,
    unload models and read the config's errors."""
    # (an empty host is every interface)
    if allow_insecure_bind or ring.api_keys_required or host == "localhost" or (host and is_loopback(host)):
        return None
    return (
        f"refusing to serve on {host!r} with no API key: any host that can reach it could use "
        "the models. Set [server] api_keys (or api_keys_file, or the CORRAL_API_KEYS "
        'environment variable), or bind host = "127.0.0.1", or, on a network you trust, '
        "set allow_insecure_bind = true."
    )
