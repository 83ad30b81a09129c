"""The floors under any router on hypercorn's trio worker: bare ASGI apps that read the
whole body and answer 400, with no framework and no model.

- `app` only receives the body: what the stack and the machine cost before a server does
  anything at all.
- `parsing_app` also parses it as JSON (msgspec, into plain Python objects): the least any
  server must do to find the prompt inside a body.

bench.hostile_prompt sends them the same huge bodies as Corral while a Corral stream runs,
so that Corral's time to the 400 and its stream's gap can be read against these floors.

  hypercorn --worker-class trio bench.bare_asgi:app
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import msgspec

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]

ANSWER = b'{"error":{"message":"refused","type":"invalid_request_error","code":"context_length_exceeded"}}'


def _make(parse: bool) -> App:
    async def serve(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        status = 200 if scope["path"] == "/health" else 400
        if parse and status == 400:
            msgspec.json.decode(b"".join(chunks))
        body = b"{}" if status == 200 else ANSWER
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return serve


app = _make(parse=False)
parsing_app = _make(parse=True)
