"""What a dialect is to the server: its routes, the paths whose errors it shapes, and its
error shapes. The app (router/app.py) registers each dialect's routes and, for an error,
asks the dialect that owns the request's path to render it: errors take a dialect's
shape at this one border.

A dialect's folder (router/api/<name>/) holds its request types, their translation into
the internal request (router/generation/job.py), its renderer of the internal events
(router/generation/events.py), its errors and its routes, and exports one `DIALECT`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from quart import Blueprint

from router.server.adapter_scales import Scales
from router.server.errors import Rendered
from router.server.openapi import Operation
from router.upstream import remote
from router.upstream.pool import Upstreams
from router.upstream.remote import RemoteModel
from supervisor.errors import CorralError, Unsupported
from supervisor.group import Served
from supervisor.supervisor import Supervisor

# A request's `model` (None: it names none) to the model's handle, within what the
# request's key may use; raises the 400 or 404 that names `model`.
Resolve = Callable[[str | None], Served]


@dataclass(frozen=True)
class Server:
    """What a dialect's routes use of the server."""

    supervisor: Supervisor
    resolve: Resolve  # for a request that uses the model: loads it (router/api/autoload.py)
    started: int  # the server's start, as a Unix time (OpenAI's model `created`)
    # The same names, for routes that load nothing by themselves or load on purpose
    # (/models/load, GET /props of an asleep model): never refused for autoload.
    find: Resolve
    upstreams: Upstreams | None = None  # models served elsewhere (router/upstream/)
    lora_scales: Scales = field(default_factory=Scales)  # POST /lora-adapters' (router/server/adapter_scales.py)

    def generating(self, model: str | None, hint: str = "; use /v1/embeddings") -> Served:
        """`resolve`, for a route that generates text: a model that serves embeddings
        only is a 400 naming `model` (`hint` says where to go instead)."""
        handle = self.resolve(model)
        if handle.spec.embeddings:
            raise Unsupported(f"The model `{model or handle.name}` serves embeddings only{hint}.", "model")
        return handle

    def target(self, model: str | None, hint: str = "; use /v1/embeddings") -> Served | RemoteModel:
        """`generating`, for a route that can also answer through translation: the model
        served elsewhere that the upstream hook chose for this request, if it chose one."""
        chosen = remote.current()
        return chosen if chosen is not None else self.generating(model, hint)


@dataclass(frozen=True)
class Dialect:
    name: str
    owns: Callable[[str], bool]  # the request paths whose errors this dialect shapes
    render_error: Callable[[CorralError], Rendered]
    # An error before any route ran: status, message, code (router/server/errors.py).
    render_http: Callable[[int, str, str | None], Rendered]
    # Adds its routes to a blueprint of its own: its view names cannot clash with another's.
    register: Callable[[Blueprint, Server], None]
    operations: tuple[Operation, ...] = ()  # its routes in GET /openapi.json
