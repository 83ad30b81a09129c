"""Image URLs: fetched only from the hosts the operator lists (`[server] image_url_hosts`).

A server that fetches whatever URL a client names reaches, on the client's behalf, what only
the server can reach: cloud metadata (169.254.169.254), admin pages on localhost, the
private network (SSRF). So by default no URL is fetched (router/generation/media.py refuses
none at parse time, as it has no config; this module does). An operator may list the hosts
whose images clients name (a CDN, an internal image store): exact names, or ".example.com"
for every name under it.

What a fetch may do, and why:
- http or https only, to a listed host, with no user info in the URL;
- no redirect is followed: a listed host could otherwise send the fetch anywhere;
- at most MAX_IMAGE_BYTES, read as they come (a larger answer is cut off and refused), within
  FETCH_SECONDS for each image and FETCH_TOTAL_SECONDS for all of a request's; an answer
  whose Content-Type is not an image is refused;
- every failure is a 400 naming the part, as a bad image is.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence
from urllib.parse import urlsplit

import httpx
import msgspec
import trio
from quart import current_app, has_app_context
from quart_trio import QuartTrio

from router.generation.job import GenerationJob
from router.generation.media import MAX_IMAGE_BYTES
from supervisor.errors import InvalidRequest, Unsupported
from worker.protocol import ChatMessage, Media

FETCH_SECONDS = 10.0  # one image, whole: a server dripping a byte at a time is cut off too
FETCH_TOTAL_SECONDS = 30.0  # all of a request's image URLs together
_HOSTS = "CORRAL_IMAGE_URL_HOSTS"


def install(app: QuartTrio, hosts: Callable[[], Sequence[str]]) -> None:
    """`hosts`: the config's list now (a reload may change it)."""
    app.config[_HOSTS] = hosts


def listed(host: str, hosts: Sequence[str]) -> bool:
    """Whether `host` is one of `hosts`: a name as written, or under a ".suffix" entry."""
    host = host.lower().rstrip(".")
    for entry in hosts:
        entry = entry.lower().rstrip(".")
        if entry.startswith(".") and (host.endswith(entry) or host == entry[1:]) or host == entry:
            return True
    return False


def _hosts() -> Sequence[str]:
    if not has_app_context():
        return ()
    getter = current_app.config.get(_HOSTS)
    return getter() if getter is not None else ()


async def fetched(
    job: GenerationJob, hosts: Sequence[str] | None = None, transport: httpx.AsyncBaseTransport | None = None
) -> GenerationJob:
    """`job` with the bytes of every image it names by URL, or a 400 naming the part.
    `hosts`: the config's (None: the running app's); `transport`: a test's."""
    if not any(m.url for m in job.images):
        return job
    hosts = _hosts() if hosts is None else hosts
    async with httpx.AsyncClient(
        follow_redirects=False, timeout=FETCH_SECONDS, trust_env=False, transport=transport
    ) as client:

        async def filled(media: Sequence[Media]) -> list[Media]:
            out = []
            for m in media:  # one after another: a request's images are few
                data = await fetch(client, m.url, m.param, hosts) if m.url else m.data
                out.append(msgspec.structs.replace(m, data=data, url=""))
            return out

        first = next(m for m in job.images if m.url)
        with trio.move_on_after(FETCH_TOTAL_SECONDS) as overall:
            messages: list[ChatMessage] = []
            for m in job.messages or ():
                messages.append(msgspec.structs.replace(m, media=await filled(m.media)) if m.media else m)
            return dataclasses.replace(
                job, messages=tuple(messages) if job.messages is not None else None, media=tuple(await filled(job.media))
            )
        assert overall.cancelled_caught
        raise InvalidRequest(
            f"Invalid image at '{first.param}': the request's image URLs took over {FETCH_TOTAL_SECONDS:.0f} s to fetch.",
            first.param,
        )


async def fetch(client: httpx.AsyncClient, url: str, param: str, hosts: Sequence[str]) -> bytes:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not hosts:
        raise Unsupported(
            f"Image URLs are not fetched ('{param}'): send the image itself as a data URI "
            "(data:image/png;base64,...), or have the operator list its host in [server] image_url_hosts.",
            param,
        )
    if parts.username is not None or parts.password is not None:
        raise Unsupported(f"Image URLs with a user name or password are not fetched ('{param}').", param)
    if parts.scheme not in ("http", "https") or not listed(host, hosts):
        raise Unsupported(
            f"Image URLs are fetched only from the hosts in [server] image_url_hosts; {host!r} is not one ('{param}').",
            param,
        )
    try:
        with trio.fail_after(FETCH_SECONDS):
            return await _read(client, url, param)
    except trio.TooSlowError:
        raise InvalidRequest(f"Invalid image at '{param}': fetching it took over {FETCH_SECONDS:.0f} s.", param) from None
    except httpx.HTTPError as exc:
        raise InvalidRequest(f"Invalid image at '{param}': it could not be fetched ({type(exc).__name__}).", param) from None


async def _read(client: httpx.AsyncClient, url: str, param: str) -> bytes:
    async with client.stream("GET", url, headers={"accept": "image/*"}) as r:
        if r.is_redirect:
            raise InvalidRequest(f"Invalid image at '{param}': the URL redirects, and redirects are not followed.", param)
        if r.status_code != 200:
            raise InvalidRequest(f"Invalid image at '{param}': fetching it answered {r.status_code}.", param)
        kind = r.headers.get("content-type", "").split(";")[0].strip().lower()
        if not kind.startswith("image/"):
            raise InvalidRequest(f"Invalid image at '{param}': the URL answered {kind or 'no type'}, not an image.", param)
        data = bytearray()
        async for chunk in r.aiter_bytes():
            data += chunk
            if len(data) > MAX_IMAGE_BYTES:
                raise InvalidRequest(f"Invalid image at '{param}': it is over {MAX_IMAGE_BYTES} bytes.", param)
        return bytes(data)
