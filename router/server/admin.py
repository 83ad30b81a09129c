"""Admin routes: what each model is doing, and load / unload / reset.

They need an admin key, or, with none configured, a client on loopback (router/server/auth.py).
"""

from __future__ import annotations

import time
from typing import Any, AsyncIterator, Awaitable, Callable

import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio

from router.server import sse
from supervisor.errors import InvalidRequest
from supervisor.group import workers_of
from supervisor.supervisor import Supervisor

_json = msgspec.json.Encoder()


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _flag(value: str | None, param: str) -> bool:
    """A boolean query parameter; anything unrecognised is a 400 rather than a silent no."""
    word = (value or "").strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise InvalidRequest(f"`{param}` must be true or false, not {value!r}.", param)


# Seconds between keep-alive comments on a quiet /admin/events stream.
KEEPALIVE_SECONDS = 15.0


def _event(obj: dict[str, Any]) -> bytes:
    """One SSE event, named by its type (EventSource's addEventListener(type))."""
    return b"event: " + str(obj["type"]).encode() + b"\n" + sse.event(_json.encode(obj))


async def _no_fleet() -> list[dict[str, Any]]:
    return []


def register(
    app: QuartTrio,
    supervisor: Supervisor,
    upstreams: Callable[[], list[dict[str, Any]]] = lambda: [],
    fleet: Callable[[], Awaitable[list[dict[str, Any]]]] = _no_fleet,
) -> None:
    """`upstreams`: the models served elsewhere, each with its replicas; `fleet`: what the
    other servers of [server] fleet answer for their models (router/upstream/)."""

    def reply(obj: object, status: int = 200) -> Response:
        return Response(_json.encode(obj), status=status, content_type="application/json")

    @app.get("/admin/models")
    async def admin_models() -> Response:
        workers = {h.name: h for h in workers_of(supervisor.handles.values())}
        return reply(
            {
                "models": [h.statistics() for h in supervisor.handles.values()],
                # Models waiting for room to load, first in line first, and why.
                # An instance of a model with several is named by its label (`name#i`).
                "load_queue": [
                    {"model": name, "reason": supervisor.admission.waiting_reason(workers[name])}
                    for name in supervisor.admission.queued()
                    if name in workers
                ],
                "config_error": supervisor.config_error,
                "needs_restart": list(supervisor.needs_restart),
                "upstreams": upstreams(),
                # Names served by a model's worker with LoRA adapters (`base =`).
                "adapter_models": [
                    {"name": v.name, "base": v.model, "aliases": list(v.aliases), "lora": [a.path.name for a in v.adapters]}
                    for v in supervisor.config.lora.values() if v.adapter_model
                ],
            }
        )

    @app.get("/admin/fleet")
    async def admin_fleet() -> Response:
        """The [server] fleet's servers and their models, each asked now (router/upstream/fleet.py)."""
        return reply({"hosts": await fleet()})

    @app.get("/admin/events")
    async def admin_events() -> Response:
        """Server-sent events of every model's lifecycle (supervisor/events.py), after a
        `snapshot` of every model as it is now. A slow reader loses its oldest events (and
        is told how many), never slows the server."""
        sub = supervisor.events.subscribe()
        snapshot = {
            "type": "snapshot", "time": time.time(),
            "models": [h.statistics() for h in supervisor.handles.values()],
        }

        async def events() -> AsyncIterator[bytes]:
            yield _event(snapshot)
            while True:
                with trio.move_on_after(KEEPALIVE_SECONDS) as quiet:
                    event = await sub.next()
                # A comment line keeps proxies from closing a quiet stream.
                yield b": keep-alive\n\n" if quiet.cancelled_caught else _event(event)

        return Response(sse.Body(events(), sub.close), status=200, headers=sse.HEADERS)

    @app.get("/admin/models/<path:name>")
    async def admin_model(name: str) -> Response:
        """One model's entry of GET /admin/models (aliases resolve to their model)."""
        return reply({"model": supervisor.resolve(name).statistics()})

    @app.post("/admin/reload")
    async def admin_reload() -> Response:
        """Re-read the config file, as SIGHUP does, once it has stopped changing (at least
        reload_settle seconds). 400 with every problem if it is invalid (the old config
        keeps running)."""
        d = await supervisor.reload_settled()  # a ConfigError is a 400 (router/server/errors.py)
        return reply(
            {
                "added": list(d.added),
                "removed": list(d.removed),
                "changed": list(d.changed),
                "unchanged": list(d.unchanged),
                "needs_restart": list(d.needs_restart),
                # Served as failed, with the rest of the file applied: model -> problem.
                "unloadable": d.unloadable,
                # Models served elsewhere: their replicas apply from the next request.
                "upstreams_added": list(d.upstreams_added),
                "upstreams_removed": list(d.upstreams_removed),
                "upstreams_changed": list(d.upstreams_changed),
            }
        )

    @app.post("/admin/models/<path:name>/load")
    async def admin_load(name: str) -> Response:
        """Load the model now (or return at once if loaded); answers when it is ready."""
        handle = supervisor.resolve(name)
        await handle.ensure_ready()
        return reply({"model": handle.statistics()})

    @app.post("/admin/models/<path:name>/unload")
    async def admin_unload(name: str) -> Response:
        """Start a graceful unload (202): requests in flight finish first, unless
        `?force=true`, which cancels them."""
        handle = supervisor.resolve(name)
        handle.request_unload(force=_flag(request.args.get("force"), "force"))
        return reply({"model": handle.statistics()}, status=202)

    @app.post("/admin/models/<path:name>/reset")
    async def admin_reset(name: str) -> Response:
        """failed -> stopped, so the next request tries to load it again."""
        handle = supervisor.resolve(name)
        was_failed = await handle.reset()
        return reply({"reset": was_failed, "model": handle.statistics()})
