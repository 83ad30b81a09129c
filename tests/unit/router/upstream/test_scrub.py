"""router/upstream/scrub.py and its edges: no configured key comes back out of an
upstream's text (issue 40, finding 6), whole, split across chunks, escaped by a JSON
encoder, in a header, or quoted by a transport error; a masked key is left alone."""

from __future__ import annotations

import httpx
import pytest

from router.upstream.checks import check
from router.upstream.pool import Upstreams
from router.upstream.relay import Relay
from router.upstream.scrub import REDACTED, Scrubber, scrubbed_errors
from supervisor.config import Config, ServerConfig, SupervisorConfig
from supervisor.config.schema import UpstreamSpec
from supervisor.errors import WorkerUnavailable

KEY = "sk-proj-Ab/9<x>&y\"z\\0123456789"
OTHER = "sk-other-0123456789abcdef"
A = "http://a:8080/v1"


def test_every_form_of_every_key_is_taken_out_and_a_masked_one_left() -> None:
    s = Scrubber([KEY, OTHER])
    assert s.text(f"Incorrect API key provided: Bearer {KEY}.") == f"Incorrect API key provided: Bearer {REDACTED}."
    assert s.text(f"x-api-key was {OTHER}") == f"x-api-key was {REDACTED}"
    escaped = '"sk-proj-Ab\\/9<x>&y\\"z\\\\0123456789"'  # as PHP's json_encode writes it
    go = '"sk-proj-Ab/9\\u003cx\\u003e\\u0026y\\"z\\\\0123456789"'  # as Go's encoding/json does
    quoted = "key=sk-proj-Ab%2F9%3Cx%3E%26y%22z%5C0123456789"
    for text in (escaped, go, quoted):
        assert KEY[-10:] not in s.text(text), text
    assert s.data(f"a {KEY} b".encode()) == f"a {REDACTED} b".encode()
    assert s.text("Incorrect API key provided: sk-proj-***6789.") == "Incorrect API key provided: sk-proj-***6789."
    # A key that holds another is taken out whole.
    assert Scrubber(["abcdefgh", "abcdefgh-longer"]).text("abcdefgh-longer") == REDACTED
    assert not Scrubber([]) and Scrubber([]).text(KEY) == KEY


def test_a_key_split_across_chunks_never_passes_and_nothing_else_is_held() -> None:
    text = f'data: {{"error": {{"message": "Bearer {KEY} refused"}}}}\n\n'.encode()
    for cut in range(1, len(text)):
        stream = Scrubber([KEY]).stream()
        out = stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.end()
        # Whole once joined, so no piece ever carried a part of the key that the next completed.
        assert out == text.replace(KEY.encode(), REDACTED.encode()), cut
    # An event's closing newline is in no key: a stream of events holds nothing back.
    stream = Scrubber([KEY]).stream()
    assert stream.feed(b'data: {"text": "s"}\n\n') == b'data: {"text": "s"}\n\n'
    # A chunk that ends like a key's start waits for the next; at the end it goes as it was.
    assert stream.feed(b"token sk-pr") == b"token " and stream.feed(b"ose") == b"sk-prose"
    assert stream.feed(b"sk-proj") == b"" and stream.end() == b"sk-proj"


def test_a_transport_errors_text_loses_the_key_and_keeps_its_class() -> None:
    with pytest.raises(httpx.RemoteProtocolError) as caught, scrubbed_errors(Scrubber([KEY])):
        raise httpx.RemoteProtocolError(f"illegal header line: b'x-echo: Bearer {KEY}'")
    assert str(caught.value) == f"illegal header line: b'x-echo: Bearer {REDACTED}'"
    assert caught.value.__suppress_context__


def _pool(*specs: UpstreamSpec, fleet_key: str | None = None) -> tuple[Upstreams, list[Config]]:
    configs = [Config(ServerConfig(), SupervisorConfig(), {}, upstreams={s.name: s for s in specs}, fleet_key=fleet_key)]
    return Upstreams(lambda: configs[-1], lambda name: None), configs


def test_every_key_sent_anywhere_is_scrubbed_from_every_upstream_even_after_a_reload() -> None:
    one = UpstreamSpec(name="one", urls=(A,), model="one", api_key=KEY)
    two = UpstreamSpec(name="two", urls=(A,), model="two", api_key=OTHER)
    pool, configs = _pool(one, two, fleet_key="fleet-admin-key-0123")
    assert pool.scrubber().text(f"{KEY} {OTHER} fleet-admin-key-0123") == f"{REDACTED} {REDACTED} {REDACTED}"
    # A reload that rotates a key: an answer to a request sent with the old one is still scrubbed.
    configs.append(Config(ServerConfig(), SupervisorConfig(), {}, upstreams={"one": UpstreamSpec(
        name="one", urls=(A,), model="one", api_key="sk-rotated-0123456789")}))
    assert pool.scrubber().text(f"{KEY} sk-rotated-0123456789") == f"{REDACTED} {REDACTED}"


@pytest.mark.trio
async def test_an_upstream_that_quotes_its_key_in_a_header_a_body_or_an_error_is_scrubbed() -> None:
    spec = UpstreamSpec(name="m", urls=(A,), model="m", api_key=KEY)
    pool, _ = _pool(spec)

    def quoting(request: httpx.Request) -> httpx.Response:
        sent = request.headers["authorization"]
        body = httpx.ByteStream(f'{{"error": {{"message": "Incorrect API key provided: {sent}"}}}}'.encode())
        return httpx.Response(401, headers={"content-type": "application/json", "request-id": sent}, stream=body)

    relay = Relay(pool, httpx.AsyncClient(transport=httpx.MockTransport(quoting)), "1.1 corral-test")
    relayed = await relay.send(spec, "k", "/v1/chat/completions", "", {}, b"{}")
    assert relayed is not None and relayed.headers["request-id"] == f"Bearer {REDACTED}"
    body = b"".join([chunk async for chunk in relayed.body])
    assert body == f'{{"error": {{"message": "Incorrect API key provided: Bearer {REDACTED}"}}}}'.encode()

    def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError(f"illegal header line: b'www-authenticate: Bearer {KEY}'", request=request)

    relay = Relay(pool, httpx.AsyncClient(transport=httpx.MockTransport(broken)), "1.1 corral-test")
    with pytest.raises(WorkerUnavailable):  # no replica answered
        await relay.send(spec, "k", "/v1/chat/completions", "", {}, b"{}")
    assert pool.of("m", A).health.last_error == f"illegal header line: b'www-authenticate: Bearer {REDACTED}'"
    await check(pool, httpx.AsyncClient(transport=httpx.MockTransport(broken)), spec, A, 1.0)
    assert KEY not in (pool.of("m", A).health.last_error or "") and REDACTED in (pool.of("m", A).health.last_error or "")
