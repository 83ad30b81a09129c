"""Health checks of upstream replicas: every `health_interval` seconds, `GET {base}/models`
on each, with the key the model sends. It is the one route every OpenAI-compatible server
has (Corral, llama-server, vLLM, hosted APIs), and it checks the key as well as the host.
Each result goes to the replica's Health (router/upstream/health.py), with the requests'
own outcomes, so a replica leaves rotation after FALL failed checks or one refused
connection, and comes back after RISE good ones.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import trio

from router.upstream.pool import Upstreams
from router.upstream.relay import request_headers
from supervisor.config.schema import UpstreamSpec

# Checks while health_interval is 0 (pings off for workers): a replica still has to come
# back into rotation somehow.
FALLBACK_INTERVAL = 10.0
CHECK_TIMEOUT = 5.0


async def check(upstreams: Upstreams, client: httpx.AsyncClient, spec: UpstreamSpec, url: str, timeout: float) -> None:
    try:
        response = await client.get(f"{url}/models", headers=request_headers({}, spec.api_key), timeout=timeout)
    except httpx.TransportError as exc:
        upstreams.observe(spec.name, url, False, str(exc) or type(exc).__name__, dead=isinstance(exc, httpx.ConnectError))
        return
    ok = response.status_code == 200
    upstreams.observe(spec.name, url, ok, None if ok else f"GET /models answered {response.status_code}")


async def watch(upstreams: Upstreams, client: httpx.AsyncClient, interval: Callable[[], float]) -> None:
    """Check every replica of every upstream model, round after round, forever."""
    while True:
        every = interval() or FALLBACK_INTERVAL
        async with trio.open_nursery() as nursery:
            for spec in upstreams.specs():
                for url in spec.urls:
                    nursery.start_soon(check, upstreams, client, spec, url, min(CHECK_TIMEOUT, every))
        upstreams.forget_removed()
        await trio.sleep(every)
