"""A model served elsewhere, reached through translation: the target a route gets instead
of a local model's handle.

The hook (router/upstream/routing.py) decides that a request in a dialect its upstream does
not speak goes there translated, and leaves a `RemoteModel` in the request's scope; the
route decodes and checks the body as for a local model (its 400s are the same), and
router/api/answering.py runs the job on the upstream (router/generation/remote/) instead
of on a worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from quart import has_request_context, request

from router.upstream.relay import Relay
from supervisor.config.schema import UpstreamSpec

SCOPE_KEY = "corral.remote_model"


@dataclass(frozen=True)
class RemoteModel:
    """A model whose requests go, translated, to its upstream: `key` is the request's
    session key (router/upstream/affinity.py), `headers` the client's, lower-cased;
    `speaks` the dialect the upstream is spoken to in ("openai" or "anthropic")."""

    spec: UpstreamSpec
    relay: Relay
    key: str
    headers: Mapping[str, str]
    speaks: str = "openai"

    @property
    def name(self) -> str:
        return self.spec.name


def put(remote: RemoteModel) -> None:
    request.scope[SCOPE_KEY] = remote  # type: ignore[literal-required]  # the ASGI scope takes any key


def current() -> RemoteModel | None:
    """The request's remote model, when the hook sent it to translation."""
    if not has_request_context():
        return None
    remote = request.scope.get(SCOPE_KEY)
    return remote if isinstance(remote, RemoteModel) else None
