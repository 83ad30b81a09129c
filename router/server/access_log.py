"""Request ids and the access log: one line per request, written when its answer is done.

Every response carries `x-request-id`: the client's own, if it sent a usable one (so a
proxy's id follows the request through), otherwise a new one. The id also travels to the
worker, whose log lines about the request carry it.

The record is made when the request arrives and lives in the ASGI scope, where the route,
the key check and the generation fill in what they learn (key name, model, tokens, first
token). It is written when the last byte of the answer has gone, or when the client has
gone: a stream's line then says how long the stream really ran, and a stream the client
left is marked so. The logger is `corral.access`; with `log_format = "json"` each line is
one JSON object holding these fields.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from hypercorn.typing import ASGISendCallable, ASGISendEvent, HTTPScope, WebsocketScope
from quart import has_request_context, request
from quart_trio import QuartTrio

log = logging.getLogger("corral.access")

SCOPE_KEY = "corral.access"
HEADER = "x-request-id"
# A client's id is kept if it is short and plain: it goes into log lines and headers, so
# nothing that could forge a line or a header passes.
_USABLE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def request_id(sent: str | None) -> str:
    return sent if sent is not None and _USABLE_ID.fullmatch(sent) else uuid.uuid4().hex


@dataclass
class Record:
    id: str
    client: str | None
    method: str
    path: str
    started: float  # time.monotonic()
    key: str | None = None  # the key's name, never the key
    key_id: str | None = None  # its owner digest (the usage ledger's and quotas' identity)
    model: str | None = None
    upstream: str | None = None  # the replica that answered, for a model served elsewhere
    status: int | None = None
    prompt_tokens: int | None = None
    generated_tokens: int | None = None
    first_token: float | None = None  # time.monotonic() of the first token
    complete: bool = False  # the whole answer went out
    upstream_broke: bool = False  # a relayed answer broke off at the upstream, not the client
    # For the metrics (router/server/request_metrics.py), not the log line:
    route: str | None = None  # the route's rule ("/v1/models/<path:model>"); None: no route
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    load_wait: float | None = None  # seconds waiting for the model to load (or for room)
    slot_wait: float | None = None  # seconds in line for a slot
    ended: float | None = None  # time.monotonic() when the answer was done
    quota_held: bool = False  # counted as begun against its key's quotas (router/usage/gate.py)

    def fields(self, now: float) -> dict[str, Any]:
        return {
            "request_id": self.id,
            "client": self.client,
            "key": self.key,
            "model": self.model,
            "upstream": self.upstream,
            "method": self.method,
            "endpoint": self.path,
            "status": self.status,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "ttft": None if self.first_token is None else round(self.first_token - self.started, 4),
            "duration": round(now - self.started, 4),
            "client_gone": not self.complete and not self.upstream_broke,
            "upstream_broke": self.upstream_broke,
        }


def line(f: dict[str, Any]) -> str:
    """The text form: id, client, key and model, the request, status, tokens, times."""
    tokens = "" if f["prompt_tokens"] is None else f" prompt={f['prompt_tokens']} generated={f['generated_tokens']}"
    ttft = "" if f["ttft"] is None else f" ttft={f['ttft']:.3f}s"
    gone = " client-gone" if f["client_gone"] else " upstream-broke" if f.get("upstream_broke") else ""
    upstream = f" upstream={f['upstream']}" if f.get("upstream") else ""
    return (
        f"{f['request_id']} {f['client'] or '-'} key={f['key'] or '-'} model={f['model'] or '-'}{upstream} "
        f'"{f["method"]} {f["endpoint"]}" {f["status"] if f["status"] is not None else "-"}'
        f"{tokens}{ttft} {f['duration']:.3f}s{gone}"
    )


def peer(scope: HTTPScope | WebsocketScope) -> str | None:
    """The connection's peer address (None: a Unix socket, or an in-process client). From
    the ASGI scope, never from a header a client could write."""
    client = scope.get("client")
    return str(client[0]) if client else None


def begin(scope: HTTPScope) -> Record:
    """The record of a request that just arrived, kept in its scope."""
    sent = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == HEADER.encode()), None)
    record = Record(
        id=request_id(sent),
        client=peer(scope),
        method=scope["method"],
        path=scope["path"],
        started=time.monotonic(),
    )
    scope[SCOPE_KEY] = record  # type: ignore[literal-required]
    return record


def watching(record: Record, send: ASGISendCallable) -> ASGISendCallable:
    """`send`, noting the status and the end of the answer, and adding the request id."""

    async def send_and_note(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            record.status = message["status"]
            headers = [h for h in message.get("headers", ()) if h[0].lower() != HEADER.encode()]
            message = {**message, "headers": [*headers, (HEADER.encode(), record.id.encode())]}
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            record.complete = True
        await send(message)

    return send_and_note


def end(record: Record, hooks: Iterable[Callable[[Record], None]] = ()) -> None:
    """Write the record's line, and hand it to `hooks`."""
    record.ended = time.monotonic()
    f = record.fields(record.ended)
    log.info("%s", line(f), extra={"fields": f})
    for hook in hooks:
        hook(record)


# app.extensions key: functions called with each finished request's Record (the metrics).
DONE_HOOKS = "corral.request_done"


def install(app: QuartTrio) -> None:
    """Note each request's route for the metrics; `end` then calls app's DONE_HOOKS."""
    app.extensions.setdefault(DONE_HOOKS, [])

    @app.before_request
    async def note_route() -> None:
        if (record := current()) is not None and request.url_rule is not None:
            record.route = request.url_rule.rule


def current() -> Record | None:
    """The record of the request being served (None outside one, or in a test that
    calls a route without the ASGI layer)."""
    if not has_request_context():
        return None
    record = request.scope.get(SCOPE_KEY)
    return record if isinstance(record, Record) else None
