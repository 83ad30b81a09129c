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

from router.upstream.relay import ANTHROPIC_VERSION, Relay
from supervisor.config.schema import UpstreamSpec

SCOPE_KEY = "corral.remote_model"
# The client's headers that a translated request keeps.
KEPT = ("user-agent", "x-session-id", "x-conversation-id", "x-request-id")


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

    def headers_out(self, accept: str) -> dict[str, str]:
        """The headers of a translated request: what says who sends it and which
        conversation it is, never the client's own dialect's (its anthropic-version or
        anthropic-beta would change the format the answer is read in, or turn a paid beta on
        with the operator's key); the upstream's dialect's version is Corral's."""
        out = {k: v for k in KEPT if (v := self.headers.get(k)) is not None}
        out.update({"content-type": "application/json", "accept": accept})
        if self.speaks == "anthropic":
            out["anthropic-version"] = ANTHROPIC_VERSION
        return out


def put(remote: RemoteModel) -> None:
    request.scope[SCOPE_KEY] = remote  # type: ignore[literal-required]  # the ASGI scope takes any key


def current() -> RemoteModel | None:
    """The request's remote model, when the hook sent it to translation."""
    if not has_request_context():
        return None
    remote = request.scope.get(SCOPE_KEY)
    return remote if isinstance(remote, RemoteModel) else None
