"""router/upstream/checks.py: a health check is bounded as a whole, reads no body, and
whatever goes wrong in it is that replica's failed check, never the end of the checks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from router.upstream.checks import check, check_headers
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


@pytest.mark.trio
async def test_an_anthropic_upstream_is_checked_with_the_version_header_its_api_requires() -> None:
    """Found by probing: without `anthropic-version`, api.anthropic.com answers GET
    /v1/models with a 400 ("anthropic-version: header is required"), so an Anthropic
    upstream left rotation after three checks and never came back: every request was a
    503. An OpenAI upstream's check is as before."""
    def anthropic_api(request: httpx.Request) -> httpx.Response:
        if "anthropic-version" not in request.headers:
            return httpx.Response(400, json={"type": "error", "error": {
                "type": "invalid_request_error", "message": "anthropic-version: header is required"}})
        return httpx.Response(200, json={"data": [], "has_more": False})

    claude = UpstreamSpec(name="m", urls=(URL,), model="m", dialects=frozenset({"anthropic"}), api_key="sk-ant")
    up = pool()
    for _ in range(4):
        await check(up, httpx.AsyncClient(transport=httpx.MockTransport(anthropic_api)), claude, URL, timeout=1.0)
    assert up.of("m", URL).health.healthy and up.of("m", URL).health.successes == 4
    assert check_headers(claude)[b"x-api-key"] == b"sk-ant"
    assert b"anthropic-version" not in check_headers(SPEC)
