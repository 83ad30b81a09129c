"""Which requests go upstream: a hook before every route.

A POST whose JSON body names (by `model`, or by the default model when it names none) a
model with an `upstream` is relayed, in the dialect it came in, when that upstream speaks
the dialect. Otherwise it goes on to the route: a model with a local worker too serves it
there; a model served elsewhere only, whose upstream speaks OpenAI's or Anthropic's
dialect, is reached through translation (router/upstream/remote.py) from the routes in
TRANSLATED; any other is a 400 naming `model`.

The key the client sent is checked first (router/server/auth.py runs before this hook),
and a key limited to other models sees an upstream model as one that does not exist, as
it sees a local one.

What an upstream keeps is its own, shared by every key of this server that reaches it. So,
once keys are configured, an ordinary key's requests in the dialects that reach an
upstream's per-user state (Responses' stored responses and `previous_response_id`,
Ollama's `keep_alive`) are translated, not relayed, where the upstream speaks OpenAI's or
Anthropic's API: the state then stays here, the key's own. And to an upstream with
`upstream_cache_salt` every request carries its key's cache scope as vLLM's `cache_salt`,
so that the upstream's prefix cache is kept apart per key too.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgspec
from quart import Response, request
from quart_trio import QuartTrio

from router.server import access_log, auth, bodies, json_body, steering
from router.server.cache_scope import cache_scope
from router.upstream import remote
from router.upstream.affinity import session_key
from router.upstream.relay import Relay, loop_problem
from supervisor import priority
from supervisor.config.keys import Key
from supervisor.config.schema import UpstreamSpec
from supervisor.errors import InvalidRequest, Unsupported, WorkerUnavailable
from supervisor.supervisor import Supervisor, unknown_model

# Dialects whose requests reach an upstream's state of a user's (stored responses, model
# lifetimes): an ordinary key's are translated where they can be (see above).
_STATEFUL = frozenset({"responses", "ollama"})
# Dialects whose bodies another Corral (and vLLM) reads `cache_salt` in.
_SALTED = frozenset({"openai", "responses", "llama"})

# Routes that manage a server rather than use its model: never relayed (an upstream's
# slots and loaded models are its own operator's business).
_NOT_RELAYED = ("/models/", "/slots", "/admin", "/metrics")
# The routes whose requests reach an upstream that does not speak their dialect, in the
# dialect it does speak (router/generation/remote/), OpenAI's tried first:
# - OpenAI's: the chat and generation routes of the Anthropic, Responses and Ollama
#   dialects, llama-server's /completion (a text completion), Ollama's embeddings, and
#   the token counts (whose routes explain that an upstream cannot count);
# - Anthropic's Messages: the chat routes of the OpenAI, Responses and Ollama dialects,
#   and OpenAI's text completions and the token counts, whose routes explain what the
#   Messages API lacks.
TRANSLATED: dict[str, frozenset[str]] = {
    "openai": frozenset({
        "/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/responses", "/v1/responses/input_tokens",
        "/responses/input_tokens", "/api/chat", "/api/generate", "/api/embed", "/api/embeddings",
        "/completion", "/completions",
    }),
    "anthropic": frozenset({
        "/v1/chat/completions", "/chat/completions", "/v1/completions", "/v1/chat/completions/input_tokens",
        "/chat/completions/input_tokens", "/v1/responses", "/responses", "/v1/responses/input_tokens",
        "/responses/input_tokens", "/api/chat", "/api/generate",
    }),
}


def translation(dialects: frozenset[str], path: str) -> str | None:
    """The dialect a request on `path` is sent in to an upstream that speaks `dialects`
    (none of them the request's own), or None: it cannot reach that upstream."""
    return next((d for d in TRANSLATED if d in dialects and path in TRANSLATED[d]), None)


class _Named(msgspec.Struct):
    model: str | None = None


# A body this hook cannot read (not JSON, not UTF-8, nested past the recursion limit, not an
# object, a `model` that is not a string) goes on to the route, which answers it as it does
# without upstreams: a route that reads a body reads it with the same decode
# (router/server/json_body.py) and refuses it in its own dialect, naming what is wrong.
def _named(body: bytes | bytearray) -> tuple[bool, str | None]:
    """Whether the body is a JSON object with a string (or no) `model`, and that model.
    Typed, so that msgspec skips every other field: a local model's 15 MB body costs a scan,
    not a decode, on the event loop."""
    try:
        named: _Named = json_body.decode(body, _Named)
    except InvalidRequest:
        return False, None
    return True, named.model


def _decoded(body: bytes | bytearray) -> dict[str, Any] | None:
    """The body as a JSON object whose `model`, if any, is a string; None for anything else."""
    try:
        decoded = json_body.decode_any(body)
    except InvalidRequest:
        return None
    if not isinstance(decoded, dict) or not isinstance(decoded.get("model", ""), (str, type(None))):
        return None
    return decoded


def relayable(path: str, routed: bool) -> bool:
    """Whether a POST to `path` may go upstream: only to one of this server's own API routes
    (`routed`: the path matched one), never to a management route, and never with a "." or
    ".." segment, which the HTTP client would resolve on the way (`/v1/%2e%2e/admin/reload`
    reaching the upstream's /admin/reload, with the upstream's key)."""
    segments = path.split("/")
    return (
        routed
        and "." not in segments and ".." not in segments
        and not any(path.startswith(p) for p in _NOT_RELAYED)
        and auth.access_of(path) is auth.Access.API
    )


def install(
    app: QuartTrio, supervisor: Supervisor, relay: Relay, dialect_of: Callable[[str], str], via_name: str
) -> None:
    @app.before_request
    async def relay_upstream_models() -> Response | None:
        if request.method != "POST" or not supervisor.config.upstreams:
            return None
        path = request.path
        if not relayable(path, request.url_rule is not None):
            return None
        body = await bodies.read_body()
        try:
            is_object, model = _named(body)
            spec = _upstream_of(supervisor, model) if is_object else None
            # Only a body that goes upstream is decoded whole (its session, its renaming).
            decoded = None if spec is None else _decoded(body)
            if spec is None or decoded is None:
                return None  # a local model's, or one the route refuses, naming what is wrong
            if (record := access_log.current()) is not None:
                record.model = spec.name
            if (loop := loop_problem(request.headers.get("via"), via_name)) is not None:
                raise WorkerUnavailable(f"The request for model `{spec.name}` cannot be relayed: {loop}.", retry=False)
            headers = {k.lower(): v for k, v in request.headers.items()}
            # No session key: any replica, the least busy first (router/upstream/choice.py, rule 4).
            key = session_key(headers, decoded) or f"random:{random.random()}"
            dialect = dialect_of(path)
            ring, sender = supervisor.config.keys, auth.current_key()
            keeps_state = dialect in _STATEFUL and not steering.may_steer(ring, sender)
            speaks = translation(spec.dialects - {dialect}, path) if keeps_state else None
            if dialect not in spec.dialects or speaks is not None:
                if spec.local:
                    return None  # its own worker serves it in every dialect
                if speaks is not None or (speaks := translation(spec.dialects, path)) is not None:
                    remote.put(remote.RemoteModel(spec, relay, key, headers, speaks))
                    return None  # the route decodes it, and answers through translation
                raise Unsupported(
                    f"The model `{spec.name}` is served by an upstream that speaks "
                    f"{', '.join(sorted(spec.dialects))}; requests to {path} cannot reach it "
                    "(set upstream_dialects if the upstream speaks this route's dialect).",
                    "model",
                )
            if dialect == "openai":
                priority.relayed(sender, decoded)  # an upstream may take it, whatever the key may
            sent = _salted(decoded, sender) if spec.cache_salt and dialect in _SALTED else decoded
            relayed = await relay.send(
                spec, key, path, request.query_string.decode("latin-1"), headers,
                _renamed(body, sent, spec, changed=sent is not decoded),
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


def _upstream_of(supervisor: Supervisor, model: str | None) -> UpstreamSpec | None:
    """The upstream model a body naming `model` goes to (None: a local one, or none)."""
    config = supervisor.config
    default = config.server.default_model
    name = model or default
    if name is None:
        return None
    spec = config.upstream(name)
    if spec is None and name.endswith(":latest"):
        # Ollama's clients name a model as /api/tags lists it, with its tag
        # (router/api/ollama/models.py, untagged).
        spec = config.upstream(name[: -len(":latest")])
    if spec is None and model is not None and default is not None and config.server.unknown_model == "default":
        # A name nothing answers to goes to the default model, as for a local one.
        if config.resolve(model) is None:
            spec = config.upstream(default)
            name = default
    if spec is None:
        return None
    key = auth.current_key()
    if key is not None and not key.may_use(spec.name):
        raise unknown_model(model or name)
    return spec


def _salted(decoded: dict[str, Any], key: Key | None) -> dict[str, Any]:
    """The body with `cache_salt` set to the sending key's cache scope (its own salt, if it
    sent one, folded in); unchanged when there is no key (one user, one scope)."""
    own = decoded.get("cache_salt")
    scope = cache_scope(key, own if isinstance(own, str) and own else None)
    return {**decoded, "cache_salt": scope} if scope else decoded


def _renamed(body: bytes | bytearray, decoded: dict[str, Any], spec: UpstreamSpec, changed: bool = False) -> bytes:
    """The body to send: as it came, or with `model` set to the name the upstream knows
    (`changed`: `decoded` differs from the body already, by its cache_salt)."""
    if not changed and decoded.get("model") == spec.model:
        return bytes(body)
    return msgspec.json.encode({**decoded, "model": spec.model})
