"""The session key of a request for a model of several instances, read before the route.

The route decodes its body into its own dialect's type and consumes it; the instance is
chosen later, in Generation.start (router/generation/instances.py), with the same key an
upstream replica would be chosen by (router/upstream/affinity.py). So this hook reads the
body first, only for a POST that names such a model (or falls to a default that is one),
and leaves the key in the request's scope. Other requests pay nothing but a dict scan.
"""

from __future__ import annotations

from quart import has_request_context, request
from quart_trio import QuartTrio

from router.server import auth, bodies, json_body
from router.upstream.affinity import session_key
from supervisor.errors import CorralError
from supervisor.group import ModelGroup
from supervisor.supervisor import Supervisor

SCOPE_KEY = "corral.instance_key"


def install(app: QuartTrio, supervisor: Supervisor) -> None:
    @app.before_request
    async def read_instance_key() -> None:
        if request.method != "POST" or auth.access_of(request.path) is not auth.Access.API:
            return
        if not any(isinstance(s, ModelGroup) for s in supervisor.handles.values()):
            return
        body = await bodies.read_body()
        try:
            try:
                decoded = json_body.decode_any(body) if body else None
                model = decoded.get("model") if isinstance(decoded, dict) else None
                served = supervisor.resolve(model if isinstance(model, str) else None)
            except CorralError:
                return  # the route answers it, naming what is wrong
            if isinstance(served, ModelGroup):
                headers = {k.lower(): v for k, v in request.headers.items()}
                key = session_key(headers, decoded)
                if key is not None:
                    request.scope[SCOPE_KEY] = key  # type: ignore[literal-required]  # the ASGI scope takes any key
        finally:
            bodies.put_back(body)  # the route reads the body as it came


def current() -> str | None:
    """The current request's session key, when it has one and its model has instances."""
    if not has_request_context():
        return None
    key = request.scope.get(SCOPE_KEY)
    return key if isinstance(key, str) else None
