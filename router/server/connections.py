"""How Corral treats HTTP connections: a `Connection: close` is honoured, and a connection
kept alive stays usable after any answer, early errors included.

Two mechanisms, both for hostile-input findings 1 and 6 of issue 8:

1. **Every ASGI `send()` runs to completion.** hypercorn does connection bookkeeping inside
   the app's final `send()`. When the last body chunk goes out, it queues `http.disconnect`
   to the app, then either closes the socket (`Connection: close`, HTTP/1.0, a request body
   left unread) or re-arms the keep-alive timer. quart-trio runs the handler and a receive
   loop in one nursery. The receive loop cancels that nursery as soon as it sees
   `http.disconnect`, which happens at the first checkpoint inside that same `send()`. So
   the close (or the re-arm) is cancelled halfway: the socket is never shut down, and its
   descriptor stays open until the client hangs up. A bare ASGI app on hypercorn closes at
   once, because nothing cancels its `send()`. The reproduction is in docs/upstream.md.
   Shielding `send()` is safe: hypercorn already shields its own socket writes, so a
   shielded send waits for nothing that an unshielded one would not, and cancellation
   still reaches the handler at its next checkpoint.

2. **The request body is read to its end before an early answer.** A 404, 405 or 400 can be
   decided before the body has arrived. HTTP/1.1 cannot start the next request on a
   connection until the current one has been read in full, so hypercorn closes such a
   connection, and a client that reuses it (every proxy) fails its next request. Reading
   the rest first, for a bounded time, keeps the connection usable. If the body is too
   large or too slow, the answer says `Connection: close`, so the client knows.
"""

from __future__ import annotations

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent
from quart import Response, request
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from werkzeug.exceptions import HTTPException

from router.server import access_log

# How long an early answer waits for the rest of a request body before it gives up on the
# connection. Generous for a body that is on its way, short enough that a stalled sender
# cannot hold the answer back.
BODY_DRAIN_SECONDS = 2.0


def complete_sends(send: ASGISendCallable) -> ASGISendCallable:
    """`send`, shielded from cancellation, so that no ASGI message is ever half sent."""

    async def send_to_completion(message: ASGISendEvent) -> None:
        with trio.CancelScope(shield=True):
            await send(message)

    return send_to_completion


def title_case_headers(send: ASGISendCallable) -> ASGISendCallable:
    """`send`, with each response header named as most HTTP/1.1 servers write it
    (`Content-Type`, `Access-Control-Allow-Origin`). Names are case-insensitive, but some
    clients read them into a plain dict (llama.cpp's own server tests do), and
    llama-server writes them so; Quart hands them over in lower case."""

    async def titled(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            headers = [(_title(name), value) for name, value in message.get("headers", ())]
            message = {**message, "headers": headers}
        await send(message)

    return titled


def _title(name: bytes) -> bytes:
    return b"-".join(part[:1].upper() + part[1:] for part in name.split(b"-"))


class HTTPConnection(TrioASGIHTTPConnection):
    """quart-trio's HTTP connection, with sends that cannot be cancelled halfway, and an
    access log line for every request once its answer is done (router/server/access_log.py)."""

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        record = access_log.begin(self.scope)
        try:
            if self.scope.get("http_version") in ("1.0", "1.1"):  # HTTP/2 names are lower case
                send = title_case_headers(send)
            await super().__call__(receive, complete_sends(access_log.watching(record, send)))
        finally:
            access_log.end(record, self.app.extensions.get(access_log.DONE_HOOKS, ()))


async def _read_rest_of_body(response: Response) -> Response:
    """after_request: make sure the request has been read in full before answering.

    Free for the routes that read their body anyway; it matters for answers decided early
    (unknown route, wrong method, a model that does not exist).
    """
    if response.status_code == 413:  # the body is over the limit: it will not be read
        response.headers["connection"] = "close"
        return response
    complete = False
    with trio.move_on_after(BODY_DRAIN_SECONDS):
        try:
            # Iterating drops each piece as it comes; a body the handler already took
            # (router/app.py) ends at once, with nothing copied.
            async for _ in request.body:
                pass
            complete = True
        except HTTPException:  # over the body limit
            pass
    if not complete:
        response.headers["connection"] = "close"
    return response


def install(app: QuartTrio) -> None:
    """Apply both mechanisms to `app`. Call before the app serves its first request."""
    app.asgi_http_class = HTTPConnection
    app.after_request(_read_rest_of_body)
