"""router/upstream/checks.py: a health check is bounded as a whole, reads no body, and
whatever goes wrong in it is that replica's failed check, never the end of the checks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from router.upstream.checks import check
from router.upstream.pool import Upstreams
from supervisor.config import Config, ServerConfig, SupervisorConfig
from supervisor.config.schema import UpstreamSpec

URL = "http://a:8080/v1"
SPEC = UpstreamSpec(name="m", urls=(URL,), model="m")


class Drip(httpx.AsyncByteStream):
    """A body that never ends: a byte every 0.1 s."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            await trio.sleep(0.1)
            yield b" "


def pool() -> Upstreams:
    cfg = Config(ServerConfig(), SupervisorConfig(), {}, upstreams={"m": SPEC})
    return Upstreams(lambda: cfg, lambda name: None)


@pytest.mark.trio
async def test_a_replica_whose_models_route_drips_passes_on_its_status_alone() -> None:
    up = pool()
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200, stream=Drip())))
    with trio.fail_after(2):
        await check(up, client, SPEC, URL, timeout=1.0)
    assert up.of("m", URL).health.healthy and up.of("m", URL).health.successes == 1


@pytest.mark.trio
async def test_a_check_that_hangs_or_breaks_is_a_failed_check_within_its_bound() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await trio.sleep_forever()
        raise AssertionError

    up = pool()
    with trio.fail_after(2):
        await check(up, httpx.AsyncClient(transport=httpx.MockTransport(hang)), SPEC, URL, timeout=0.3)
    assert up.of("m", URL).health.last_error == "GET /models did not answer within 0.3 s"

    def broken(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("a bug in the client")

    await check(up, httpx.AsyncClient(transport=httpx.MockTransport(broken)), SPEC, URL, timeout=1.0)
    assert up.of("m", URL).health.last_error == "health check failed: RuntimeError"
    await check(up, httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(401))), SPEC, URL, 1.0)
    state = up.of("m", URL).health
    assert state.last_error == "GET /models answered 401" and not state.healthy  # three in a row
