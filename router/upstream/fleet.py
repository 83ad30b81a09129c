"""The fleet: other Corral servers this one shows beside its own ([server] fleet).

`GET /admin/fleet` asks every server of the fleet for its `/admin/models` at once, with
the fleet's admin key, and answers what each said, or why it said nothing, in the shape
`corral status --url A --url B --json` prints: {"hosts": [{"url", ...its /admin/models}
or {"url", "error"}]}. The dashboard's fleet table and `corral status --fleet` read it.

Each answer is bounded in time (ASK_TIMEOUT, as a whole) and in size (MAX_BYTES): a server
that hangs, drips or sends gigabytes costs its own row, never the others' or the page's.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import trio

from router.server import json_text

log = logging.getLogger("corral.upstream")

ASK_TIMEOUT = 5.0
MAX_BYTES = 4 * 1024 * 1024


async def ask(client: httpx.AsyncClient, url: str, key: str | None, timeout: float = ASK_TIMEOUT) -> dict[str, Any]:
    """One server's /admin/models, with its URL; or its URL and why there is none."""
    root = url.rstrip("/")
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    error: str | None = None
    body = b""
    with trio.move_on_after(timeout) as scope:
        try:
            async with client.stream("GET", root + "/admin/models", headers=headers) as response:
                async for chunk in response.aiter_raw():
                    body += chunk
                    if len(body) > MAX_BYTES:
                        error = f"its answer is larger than {MAX_BYTES // (1024 * 1024)} MiB"
                        break
                if error is None and response.status_code != 200:
                    error = f"GET /admin/models answered {response.status_code}" + (
                        " (check [server] fleet_key_env or fleet_key_file)" if response.status_code in (401, 403) else ""
                    )
        except httpx.TransportError as exc:
            error = f"cannot reach it: {str(exc) or type(exc).__name__}"
        except Exception as exc:  # one server's row, never the whole answer
            log.exception("asking %s for its models failed", root)
            error = f"asking it failed: {type(exc).__name__}"
    if scope.cancelled_caught:
        error = f"it did not answer within {timeout:g} s"
    if error is not None:
        return {"url": root, "error": error}
    try:
        models = json_text.loads(body)
    except ValueError:
        models = None
    if not isinstance(models, dict) or not isinstance(models.get("models"), list):
        return {"url": root, "error": "its answer is not a Corral server's /admin/models"}
    return {**models, "url": root}


async def gather(client: httpx.AsyncClient, urls: list[str], key: str | None) -> list[dict[str, Any]]:
    """Every server's answer, asked at once, in the fleet's order."""
    out: list[dict[str, Any]] = [{} for _ in urls]

    async def one(i: int, url: str) -> None:
        out[i] = await ask(client, url, key)

    async with trio.open_nursery() as nursery:
        for i, url in enumerate(urls):
            nursery.start_soon(one, i, url)
    return out
