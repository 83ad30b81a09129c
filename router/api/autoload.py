"""Whether a request may load the model it names (llama-server's --models-autoload, and
the `?autoload=` that overrides it per request, server-models.cpp). Off, a request for a
model that is neither running nor asleep is a 400 "model is not loaded", as llama-server
answers it; an asleep model (stopped by its idle_timeout) wakes, as llama-server's
sleeping children do."""

from __future__ import annotations

from quart import request

from router.api.dialect import Resolve
from supervisor.errors import InvalidRequest
from supervisor.group import Served
from supervisor.lifecycle import State
from supervisor.supervisor import Supervisor

_RUNNING = (State.STARTING, State.READY, State.DRAINING)


def may_load(configured: bool, asked: str | None) -> bool:
    """The config's models_autoload, unless the request's `?autoload=` says otherwise
    (llama-server reads "true" and "1" as on, any other value as off)."""
    if asked is None:
        return configured
    return asked.lower() in ("true", "1")


def available(handle: Served) -> bool:
    """Running, loading, or asleep: a request reaches it without a load of its own."""
    return handle.state in _RUNNING or handle.sleeping


def gated(resolve: Resolve, supervisor: Supervisor) -> Resolve:
    """`resolve`, refusing a model that is not loaded when nothing may load it."""

    def resolve_loadable(model: str | None) -> Served:
        handle = resolve(model)
        if not available(handle) and not may_load(
            supervisor.config.server.models_autoload, request.args.get("autoload")
        ):
            raise InvalidRequest(
                f"model is not loaded: load `{handle.name}` with POST /models/load, "
                "or ask ?autoload=true ([server] models_autoload = false).",
                "model",
            )
        return handle

    return resolve_loadable
