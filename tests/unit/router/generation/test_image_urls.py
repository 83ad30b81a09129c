"""router/generation/image_urls.py: image URLs are fetched only from the operator's hosts,
without redirects, bounded, and every failure is a 400 naming the part (issue 42, item 2)."""

from __future__ import annotations

import httpx
import pytest

from router.generation import image_urls
from router.generation.job import GenerationJob
from router.generation.media import MAX_IMAGE_BYTES
from supervisor.errors import CorralError
from worker.protocol import ChatMessage, Media, SamplingParams

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 32
PARAM = "messages[0].content[1].image_url.url"


def job(url: str) -> GenerationJob:
    m = ChatMessage(role="user", content="look <__media__>", media=[Media(data=b"", param=PARAM, url=url)])
    return GenerationJob(model="m", params=SamplingParams(), messages=(m,))


def handler(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if path == "/red.png":
        return httpx.Response(200, content=PNG, headers={"content-type": "image/png"})
    if path == "/moved":
        return httpx.Response(302, headers={"location": "http://169.254.169.254/latest/meta-data"})
    if path == "/page":
        return httpx.Response(200, content=b"<html>", headers={"content-type": "text/html"})
    if path == "/huge":
        return httpx.Response(200, content=b"\0" * (MAX_IMAGE_BYTES + 1), headers={"content-type": "image/png"})
    return httpx.Response(404)


async def fetch(url: str, hosts: list[str]) -> GenerationJob:
    return await image_urls.fetched(job(url), hosts, httpx.MockTransport(handler))


async def refused(url: str, hosts: list[str]) -> str:
    with pytest.raises(CorralError) as info:
        await fetch(url, hosts)
    assert info.value.param == PARAM
    return info.value.message


async def test_an_image_from_a_listed_host_is_fetched_into_its_part() -> None:
    out = await fetch("https://img.example.com/red.png", [".example.com"])
    assert out.messages is not None and out.messages[0].media == [Media(data=PNG, param=PARAM)]


@pytest.mark.parametrize(
    ("url", "hosts", "says"),
    [
        ("https://img.example.com/red.png", [], "not fetched"),
        ("http://169.254.169.254/latest/meta-data", ["img.example.com"], "'169.254.169.254' is not one"),
        ("http://localhost/red.png", ["img.example.com"], "'localhost' is not one"),
        ("https://evil-example.com/red.png", [".example.com"], "is not one"),
        ("https://user:pw@img.example.com/red.png", ["img.example.com"], "user name or password"),
        ("https://evil.example@img.example.com/red.png", ["img.example.com"], "user name or password"),
        ("https://img.example.com/moved", ["img.example.com"], "redirects"),
        ("https://img.example.com/page", ["img.example.com"], "not an image"),
        ("https://img.example.com/huge", ["img.example.com"], "over"),
        ("https://img.example.com/gone", ["img.example.com"], "answered 404"),
    ],
)
async def test_each_url_that_may_not_be_fetched_is_a_400_naming_the_part(url: str, hosts: list[str], says: str) -> None:
    assert says in await refused(url, hosts)


@pytest.mark.parametrize(
    ("host", "hosts", "ok"),
    [
        ("img.example.com", ["img.example.com"], True),
        ("IMG.example.com.", ["img.example.com"], True),
        ("a.b.example.com", [".example.com"], True),
        ("example.com", [".example.com"], True),
        ("badexample.com", [".example.com"], False),
        ("example.com.evil", [".example.com"], False),
        ("img.example.com", ["example.com"], False),
    ],
)
def test_listed_hosts_match_by_name_or_suffix(host: str, hosts: list[str], ok: bool) -> None:
    assert image_urls.listed(host, hosts) is ok


async def test_a_server_that_drips_its_answer_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import trio

    monkeypatch.setattr(image_urls, "FETCH_SECONDS", 0.5)

    class Drip(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[no-untyped-def]
            for _ in range(100):
                await trio.sleep(0.1)
                yield b"\0"

    transport = httpx.MockTransport(lambda r: httpx.Response(200, headers={"content-type": "image/png"}, stream=Drip()))
    with pytest.raises(CorralError) as info:
        await image_urls.fetched(job("https://img.example.com/drip"), ["img.example.com"], transport)
    assert info.value.param == PARAM and "took over" in info.value.message
