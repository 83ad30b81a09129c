"""router/upstream/relay.py: where a request goes, what it carries, and failover before
the first byte, against replicas simulated by httpx's MockTransport."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from router.upstream.pool import LOCAL, LocalLoad, Upstreams
from router.upstream.relay import Relay, loop_problem, request_headers, upstream_url
from supervisor.config import Config, ServerConfig, SupervisorConfig
from supervisor.config.schema import UpstreamSpec
from supervisor.errors import Overloaded, WorkerCrashed, WorkerUnavailable

A, B = "http://a:8080/v1", "http://b:8080/v1"


def test_every_dialects_path_is_taken_from_the_servers_root() -> None:
    assert upstream_url(A, "/v1/chat/completions", "") == "http://a:8080/v1/chat/completions"
    assert upstream_url(A, "/api/chat", "") == "http://a:8080/api/chat"  # Ollama's
    assert upstream_url("https://h/openai/v1", "/v1/messages", "beta=true") == "https://h/openai/v1/messages?beta=true"
    assert upstream_url("http://h:8080", "/completion", "") == "http://h:8080/completion"


def test_the_clients_key_never_goes_upstream_and_the_configured_one_does() -> None:
    sent = request_headers(
        {"authorization": "Bearer client-key", "x-api-key": "client-key", "cookie": "c", "content-type": "application/json",
         "anthropic-version": "2023-06-01", "x-session-id": "s"},
        "sk-up",
    )
    assert sent == {
        b"content-type": b"application/json", b"anthropic-version": b"2023-06-01", b"x-session-id": b"s",
        b"accept-encoding": b"identity", b"authorization": b"Bearer sk-up", b"x-api-key": b"sk-up",
    }
    assert b"authorization" not in request_headers({"authorization": "Bearer client-key"}, None)
    # A header value goes as the Latin-1 bytes it came as, never an error of ours.
    assert request_headers({"user-agent": "caf\xe9"}, None)[b"user-agent"] == b"caf\xe9"
    # Each relay adds itself to Via, after whatever the request already passed.
    assert request_headers({"via": "1.1 nginx"}, None, "1.1 corral-ab")[b"via"] == b"1.1 nginx, 1.1 corral-ab"


def test_a_request_that_comes_back_around_is_refused() -> None:
    assert loop_problem(None, "corral-ab") is None
    assert loop_problem("1.1 nginx, 1.1 corral-cd", "corral-ab") is None
    assert loop_problem("1.1 corral-ab", "corral-ab") == "it has passed through this server already: an upstream leads back to it"
    many = ", ".join(f"1.1 corral-{i}" for i in range(8))
    assert loop_problem(many, "corral-ab") == "it has passed through 8 Corral servers already"


Handler = Callable[[httpx.Request], httpx.Response]


def reply(status: int, body: bytes) -> httpx.Response:
    """An answer whose body is still to be read, as a real server's streamed one is."""
    return httpx.Response(status, headers={"content-type": "application/json"}, stream=httpx.ByteStream(body))


def relay_for(spec: UpstreamSpec, handler: Handler, local: LocalLoad | None = None) -> Relay:
    cfg = Config(ServerConfig(), SupervisorConfig(), {}, upstreams={spec.name: spec})
    pool = Upstreams(lambda: cfg, lambda name: local)
    return Relay(pool, httpx.AsyncClient(transport=httpx.MockTransport(handler)), "1.1 corral-test")


async def send(relay: Relay, spec: UpstreamSpec, key: str = "k") -> tuple[int, bytes, str] | None:
    relayed = await relay.send(spec, key, "/v1/completions", "", {"content-type": "application/json"}, b'{"model":"m"}')
    if relayed is None:
        return None
    body = b"".join([chunk async for chunk in relayed.body])
    return relayed.status, body, relayed.replica


def spec_of(*urls: str, **kw: object) -> UpstreamSpec:
    return UpstreamSpec(name="m", urls=urls, model="m", **kw)  # type: ignore[arg-type]


@pytest.mark.trio
async def test_a_refused_connection_fails_over_and_takes_the_replica_out_at_once() -> None:
    spec = spec_of(A, B)
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        if request.url.host == "a":
            raise httpx.ConnectError("refused", request=request)
        return reply(200, b"answer")

    relay = relay_for(spec, handler)
    for key in ("k1", "k2", "k3", "k4"):
        assert await send(relay, spec, key) == (200, b"answer", B)
    assert seen.count("a") == 1  # out of rotation after one refusal: never tried again
    state = relay.upstreams.of("m", A)
    assert not state.health.healthy and state.outcomes["failed_over"] == 1 and state.in_flight == 0
    assert relay.upstreams.of("m", B).outcomes["ok"] == 4 and relay.upstreams.of("m", B).in_flight == 0


@pytest.mark.trio
async def test_a_503_fails_over_while_another_replica_can_take_it_and_is_passed_on_when_none_can() -> None:
    spec = spec_of(A, B)
    relay = relay_for(spec, lambda r: reply(503, b"busy " + r.url.host.encode()))
    status, body, replica = await send(relay, spec) or (0, b"", "")
    # Both tried; the last one's 503 is the answer (the client sees the upstream's error).
    assert status == 503 and body == b"busy " + replica.split("//")[1][0].encode()
    assert sum(relay.upstreams.of("m", u).outcomes["failed_over"] for u in (A, B)) == 1
    assert sum(relay.upstreams.of("m", u).outcomes["failed"] for u in (A, B)) == 1


@pytest.mark.trio
@pytest.mark.parametrize("status", [500, 501])
async def test_an_error_a_request_provokes_is_its_answer_and_never_takes_a_replica_out(status: int) -> None:
    """A 500 or 501 is the upstream's answer to this request (a route it does not serve,
    a body it chokes on): passed on, no failover, no failed check. Repeated, it must not
    let one client take every replica out of rotation (a hostile probe did, with /props)."""
    spec = spec_of(A, B)
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        return reply(status, b"no")

    relay = relay_for(spec, handler)
    for _ in range(6):
        assert (await send(relay, spec, "same"))[:2] == (status, b"no")  # type: ignore[index]
    assert len(seen) == 6 and len(set(seen)) == 1
    assert all(relay.upstreams.of("m", u).health.healthy for u in (A, B))


@pytest.mark.trio
async def test_a_redirect_is_a_502_naming_where_it_pointed() -> None:
    spec = spec_of(A)
    relay = relay_for(spec, lambda r: httpx.Response(302, headers={"location": "https://elsewhere/v1"}))
    with pytest.raises(WorkerCrashed, match=r"answered a redirect \(302\) to https://elsewhere/v1"):
        await send(relay, spec)
    assert relay.upstreams.of("m", A).in_flight == 0 and relay.upstreams.of("m", A).outcomes["failed"] == 1


@pytest.mark.trio
async def test_a_4xx_is_the_upstreams_answer_not_a_failure() -> None:
    spec = spec_of(A, B)
    relay = relay_for(spec, lambda r: reply(400, b'{"error":"bad"}'))
    assert await send(relay, spec, "k") == (400, b'{"error":"bad"}', (await send(relay, spec, "k") or (0, b"", ""))[2])
    assert all(relay.upstreams.of("m", u).health.healthy for u in (A, B))


@pytest.mark.trio
async def test_with_every_replica_down_or_full_the_client_is_told_which() -> None:
    spec = spec_of(A, max_concurrency=1)
    relay = relay_for(spec, lambda r: reply(200, b"x"))
    first = await relay.send(spec, "k", "/v1/completions", "", {}, b"{}")
    assert first is not None and relay.upstreams.of("m", A).in_flight == 1  # until its body is read
    with pytest.raises(Overloaded, match="max_concurrency = 1"):
        await relay.send(spec, "k", "/v1/completions", "", {}, b"{}")
    assert b"".join([c async for c in first.body]) == b"x" and relay.upstreams.of("m", A).in_flight == 0
    relay.upstreams.observe("m", A, False, "refused", dead=True)
    with pytest.raises(WorkerUnavailable, match=r"is in rotation \(1 failing their health checks\)"):
        await relay.send(spec, "k", "/v1/completions", "", {}, b"{}")


@pytest.mark.trio
async def test_the_local_worker_is_a_replica_and_spills_over_when_its_line_is_full() -> None:
    spec = spec_of(A, local=True)
    relay = relay_for(spec, lambda r: reply(200, b"remote"), LocalLoad(in_flight=0, line_full=False))
    keys = [f"k{i}" for i in range(40)]
    local = [k for k in keys if await send(relay, spec, k) is None]
    assert 0 < len(local) < len(keys)  # the keys spread over both
    full = relay_for(spec, lambda r: reply(200, b"remote"), LocalLoad(in_flight=2, line_full=True))
    assert [await send(full, spec, k) for k in local] == [(200, b"remote", A)] * len(local)  # spilled over
    assert [r.name for r in full.upstreams.replicas(spec)] == [A, LOCAL]


@pytest.mark.trio
async def test_an_answer_closed_before_its_first_chunk_is_counted_and_its_connection_closed() -> None:
    """A client that leaves between the headers and the first chunk: Quart closes the body
    without reading it, and the replica's count must still come down (else max_concurrency
    fills with ghosts and a drain on SIGTERM waits for them)."""
    spec = spec_of(A, max_concurrency=1)
    relay = relay_for(spec, lambda r: reply(200, b"never read"))
    relayed = await relay.send(spec, "k", "/v1/completions", "", {}, b"{}")
    assert relayed is not None and relay.upstreams.of("m", A).in_flight == 1
    await relayed.body.aclose()
    await relayed.body.aclose()  # once only
    state = relay.upstreams.of("m", A)
    assert state.in_flight == 0 and state.outcomes["ok"] == 1
    again = await relay.send(spec, "k", "/v1/completions", "", {}, b"{}")  # the slot is free
    assert again is not None and b"".join([c async for c in again.body]) == b"never read"


@pytest.mark.trio
async def test_a_5xx_no_client_can_read_becomes_an_error_in_the_clients_shape() -> None:
    """A proxy's HTML 500 reached an Anthropic client as HTML (a hostile probe, 2026-11-27):
    a 5xx that is not JSON or events is an error the dialect renders (503 for the statuses
    that say "unavailable", else 502); a JSON one is passed on."""
    spec = spec_of(A)
    html = relay_for(spec, lambda r: httpx.Response(500, headers={"content-type": "text/html"}, stream=httpx.ByteStream(b"<html>")))
    with pytest.raises(WorkerCrashed, match=r"The upstream of model `m` failed \(500\)"):
        await send(html, spec)
    assert html.upstreams.of("m", A).in_flight == 0 and html.upstreams.of("m", A).health.healthy
    shaped = relay_for(spec, lambda r: httpx.Response(
        500, headers={"content-type": "application/json; charset=utf-8"}, stream=httpx.ByteStream(b'{"error": {}}')
    ))
    assert await send(shaped, spec) == (500, b'{"error": {}}', A)
