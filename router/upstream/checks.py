"""Health checks of upstream replicas: every `health_interval` seconds, `GET {base}/models`
on each, with the key the model sends. It is the one route every OpenAI-compatible server
has (Corral, llama-server, vLLM, hosted APIs), and Anthropic's API too, and it checks the
key as well as the host.
Each result goes to the replica's Health (router/upstream/health.py), with the requests'
own outcomes, so a replica leaves rotation after FALL failed checks or one refused
connection, and comes back after RISE good ones.

A check is its status line only (the body is never read: a replica that drips or sends
gigabytes costs nothing), bounded as a whole by CHECK_TIMEOUT, and whatever goes wrong
in one is that replica's failed check: one replica can neither stall the others' checks
nor stop them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import trio

from router.upstream.pool import Upstreams
from router.upstream.relay import ANTHROPIC_VERSION, request_headers
from router.upstream.scrub import scrubbed_errors
from supervisor.config.schema import UpstreamSpec

log = logging.getLogger("corral.upstream")

# Checks while health_interval is 0 (pings off for workers): a replica still has to come
# back into rotation somehow.
FALLBACK_INTERVAL = 10.0
CHECK_TIMEOUT = 5.0


async def check(upstreams: Upstreams, client: httpx.AsyncClient, spec: UpstreamSpec, url: str, timeout: float) -> None:
    status: int | None = None
    error: str | None = None
    dead = False
    with trio.move_on_after(timeout) as scope:
        try:
            # A transport error's text may quote what the replica sent: it goes to the log
            # and to last_error only with the keys taken out.
            with scrubbed_errors(upstreams.scrubber()):
                async with client.stream("GET", f"{url}/models", headers=check_headers(spec)) as response:
                    status = response.status_code
        except httpx.TransportError as exc:
            error, dead = str(exc) or type(exc).__name__, isinstance(exc, httpx.ConnectError)
        except Exception as exc:  # a check must never end the checks
            log.exception("health check of %s (model %s) failed", url, spec.name)
            error = f"health check failed: {type(exc).__name__}"
    if scope.cancelled_caught:
        error = f"GET /models did not answer within {timeout:g} s"
    elif status is not None and status != 200:
        error = f"GET /models answered {status}"
    upstreams.observe(spec.name, url, error is None, error, dead=dead)


def check_headers(spec: UpstreamSpec) -> dict[bytes, bytes]:
    """The check's headers: the model's key, and for an upstream that speaks Anthropic's
    API the version header, without which api.anthropic.com answers every request (its
    GET /v1/models included) with a 400, and the replica would never be in rotation."""
    given = {"anthropic-version": ANTHROPIC_VERSION} if "anthropic" in spec.dialects else {}
    return request_headers(given, spec.api_key)


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
