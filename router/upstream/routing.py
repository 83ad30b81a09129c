"""Which requests go upstream: a hook before every route.

A POST whose JSON body names (by `model`, or by the default model when it names none) a
model with an `upstream` is relayed, in the dialect it came in, when that upstream speaks
the dialect; otherwise it goes on to the route, which serves it locally. A model that is
upstream only and does not speak the request's dialect is a 400 naming `model`: Corral
does not translate between dialects for an upstream yet.

The key the client sent is checked first (router/server/auth.py runs before this hook),
and a key limited to other models sees an upstream model as one that does not exist, as
it sees a local one.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec
from quart import Response, request
from quart_trio import QuartTrio

from router.server import access_log, auth, bodies
from router.upstream.affinity import session_key
from router.upstream.relay import Relay
from supervisor.config.schema import UpstreamSpec
from supervisor.errors import Unsupported
from supervisor.supervisor import Supervisor, unknown_model

# Routes that manage a server rather than use its model: never relayed (an upstream's
# slots and loaded models are its own operator's business).
_NOT_RELAYED = ("/models/", "/slots", "/admin")


class _Named(msgspec.Struct):
    model: str | None = None


def _named_model(body: bytes | bytearray) -> tuple[bool, str | None]:
    """(whether the body is a JSON object, the model it names)."""
    try:
        return True, msgspec.json.decode(body, type=_Named).model
    except msgspec.DecodeError:
        return False, None  # not JSON, or `model` not a string: the route says what is wrong


def install(app: QuartTrio, supervisor: Supervisor, relay: Relay, dialect_of: Callable[[str], str]) -> None:
    @app.before_request
    async def relay_upstream_models() -> Response | None:
        if request.method != "POST" or not supervisor.config.upstreams:
            return None
        path = request.path
        if any(path.startswith(p) for p in _NOT_RELAYED) or auth.access_of(path) is not auth.Access.API:
            return None
        body = await bodies.read_body()
        try:
            spec = _upstream_of(supervisor, body)
            if spec is None:
                return None
            if (record := access_log.current()) is not None:
                record.model = spec.name
            dialect = dialect_of(path)
            if dialect not in spec.dialects:
                if spec.local:
                    return None  # its own worker serves it in every dialect
                raise Unsupported(
                    f"The model `{spec.name}` is served by an upstream that speaks "
                    f"{', '.join(sorted(spec.dialects))}; requests in the {dialect} dialect cannot reach it "
                    "(set upstream_dialects if the upstream speaks it).",
                    "model",
                )
            headers = {k.lower(): v for k, v in request.headers.items()}
            relayed = await relay.send(
                spec, _affinity(headers, body), path, request.query_string.decode("latin-1"), headers, _renamed(body, spec)
            )
            if relayed is None:
                return None  # the local worker: the route serves it
        finally:
            bodies.put_back(body)  # the route, if it runs, reads the body as it came
        if (record := access_log.current()) is not None:
            record.upstream = relayed.replica
        response = Response(relayed.body, status=relayed.status, headers=relayed.headers)
        response.timeout = None  # a stream lasts as long as the generation
        return response


def _upstream_of(supervisor: Supervisor, body: bytes | bytearray) -> UpstreamSpec | None:
    is_object, model = _named_model(body)
    if not is_object:
        return None
    name = model or supervisor.config.server.default_model
    if name is None:
        return None
    spec = supervisor.config.upstream(name)
    if spec is None:
        return None
    key = auth.current_key()
    if key is not None and not key.may_use(spec.name):
        raise unknown_model(name)
    return spec


def _affinity(headers: dict[str, str], body: bytes | bytearray) -> str:
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError:
        decoded = None
    # No key: any replica, the least busy first (router/upstream/choice.py, rule 4).
    return session_key(headers, decoded) or f"random:{random.random()}"


def _renamed(body: bytes | bytearray, spec: UpstreamSpec) -> bytes:
    """The body to send: as it came, or with `model` set to the name the upstream knows."""
    _, model = _named_model(body)
    if model == spec.model:
        return bytes(body)
    decoded = msgspec.json.decode(body)
    decoded["model"] = spec.model
    return msgspec.json.encode(decoded)
