"""HTTP connections as odd clients use them (issue 8, findings 1, 5 and 6): the real app,
served by hypercorn on a socket, spoken to byte by byte.

Each of these failed before its fix: the server answered `Connection: close` and HTTP/1.0
requests but never closed its side; a kept-alive connection went silent after a 404 whose
body came late; `//admin/models` was an HTML redirect.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import trio

from router.server import connections
from tests.process.support import make_supervisor, serving_http


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        assert self.headers.get("content-type", "").startswith("application/json"), self.headers
        return json.loads(self.body)


class RawClient:
    """One TCP connection, written and read by hand, so nothing is hidden by a library."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buf = b""

    @classmethod
    async def connect(cls, base: str) -> RawClient:
        host, port = base.removeprefix("http://").rsplit(":", 1)
        return cls(await trio.open_tcp_stream(host, int(port)))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _more(self) -> bytes:
        data = await self.stream.receive_some(65536)
        if not data:
            raise EOFError("the server closed the connection")
        return data

    async def reply(self) -> Reply:
        """Read one whole response (headers, then a content-length body)."""
        while b"\r\n\r\n" not in self._buf:
            self._buf += await self._more()
        head, self._buf = self._buf.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
        length = int(headers.get("content-length", "0"))
        while len(self._buf) < length:
            self._buf += await self._more()
        body, self._buf = self._buf[:length], self._buf[length:]
        return Reply(int(status_line.split()[1]), headers, body)

    async def closed_by_server(self) -> bool:
        """True once the server has sent FIN (and nothing else)."""
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            return True  # a reset is a close too
        return data == b"" and not self._buf

    async def aclose(self) -> None:
        await self.stream.aclose()


def _server_sockets(port: int) -> int:
    """Sockets this process holds on the server side of `port`, the listener excepted."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status != psutil.CONN_LISTEN
    )


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def test_100_connection_close_requests_are_all_closed_by_the_server(tmp_path: Path) -> None:
    """Finding 1: the socket close was cancelled halfway through the app's last send(), so
    the server never sent FIN and kept one descriptor per connection."""
    sup = make_supervisor(tmp_path, {"a": {}})
    async with serving_http(sup) as base:
        baseline = _open_fds()
        clients: list[RawClient] = []
        delays: list[float] = []

        async def one() -> None:
            c = await RawClient.connect(base)
            clients.append(c)  # held open: only the server may end the connection
            await c.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            r = await c.reply()
            assert r.status == 200 and r.json() == {"status": "ok"}
            answered = trio.current_time()
            with trio.fail_after(1.0):  # the acceptance bound: FIN within 1 s of the answer
                assert await c.closed_by_server()
            delays.append(trio.current_time() - answered)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(100):
                    nursery.start_soon(one)
        assert len(delays) == 100
        # Every client still holds its socket, yet the server has none left open.
        assert _server_sockets(_port(base)) == 0
        for c in clients:
            await c.aclose()
        assert _open_fds() <= baseline


async def test_http_1_0_requests_are_closed_by_the_server(tmp_path: Path) -> None:
    sup = make_supervisor(tmp_path, {"a": {}})
    async with serving_http(sup) as base:
        c = await RawClient.connect(base)
        await c.send(b"GET /v1/models HTTP/1.0\r\n\r\n")
        r = await c.reply()
        assert r.status == 200
        with trio.fail_after(1.0):
            assert await c.closed_by_server()
        await c.aclose()


async def test_a_413_says_connection_close_and_closes(tmp_path: Path) -> None:
    sup = make_supervisor(tmp_path, {"a": {}})
    async with serving_http(sup) as base:
        c = await RawClient.connect(base)
        body = b'{"model": "a", "prompt": "' + b"x" * (17 * 1024 * 1024) + b'"}'
        # Only the headers: the server must refuse on Content-Length without the body.
        await c.send(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        with trio.fail_after(5):
            r = await c.reply()
            assert r.status == 413
            assert r.headers.get("connection", "").lower() == "close"
            assert r.json()["error"]["code"] == "request_too_large"  # type: ignore[index]
            assert await c.closed_by_server()
        await c.aclose()


async def test_keep_alive_survives_a_404_whose_body_arrives_late(tmp_path: Path) -> None:
    """Finding 6: the 404 was decided before the body arrived; the connection then went
    silent, so a proxy that reused it hung on its next request."""
    sup = make_supervisor(tmp_path, {"a": {}})
    async with serving_http(sup) as base:
        c = await RawClient.connect(base)
        for path, status in ((b"/nope", 404), (b"/v1/models", 405), (b"/health", 405)):
            body = b'{"model": "a", "prompt": "hi"}'
            await c.send(
                b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % (path, len(body))
            )
            await trio.sleep(0.04)  # the body follows its headers 40 ms later
            await c.send(body)
            with trio.fail_after(5):
                r = await c.reply()
                assert r.status == status
                assert r.headers.get("connection", "keep-alive").lower() != "close"
                await c.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                assert (await c.reply()).status == 200  # the same connection still answers
        await c.aclose()


async def test_an_early_answer_to_a_stalled_body_says_close_and_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body that stops coming cannot hold the 404 back past the drain time, and the
    connection cannot be reused (its request never ended), so the answer says so."""
    monkeypatch.setattr(connections, "BODY_DRAIN_SECONDS", 0.3)
    sup = make_supervisor(tmp_path, {"a": {}})
    async with serving_http(sup) as base:
        c = await RawClient.connect(base)
        await c.send(b"POST /nope HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{\"model\": ")
        with trio.fail_after(3):
            r = await c.reply()
            assert r.status == 404
            assert r.headers.get("connection", "").lower() == "close"
            assert await c.closed_by_server()
        await c.aclose()


async def test_an_idle_keep_alive_connection_times_out(tmp_path: Path) -> None:
    """The keep-alive timer was re-armed inside the cancelled send too, so an idle
    connection was never closed: one descriptor per client that walked away."""
    sup = make_supervisor(tmp_path, {"a": {}})
    async with serving_http(sup, keep_alive_timeout=0.5) as base:
        c = await RawClient.connect(base)
        await c.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert (await c.reply()).status == 200
        with trio.fail_after(3):
            assert await c.closed_by_server()
        await c.aclose()


async def test_doubled_slashes_are_answered_in_json_never_redirected(tmp_path: Path) -> None:
    """Finding 5b (e067773): Werkzeug redirected `/admin//models` with an HTML 308, past
    every error handler.
    Leading slashes are collapsed by Werkzeug's own request path, which routing and any
    check on the path both read; doubled slashes inside a path are a 404."""
    sup = make_supervisor(tmp_path, {"a": {}})
    async with serving_http(sup) as base:
        c = await RawClient.connect(base)
        for method, path, status in (
            (b"GET", b"//admin/models", 200),
            (b"GET", b"//v1/models", 200),
            (b"GET", b"/admin//models", 404),
            (b"POST", b"/admin/models//a/unload", 404),
            (b"POST", b"//admin//reload", 404),
            (b"POST", b"/v1//chat/completions", 404),
        ):
            await c.send(b"%s %s HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n" % (method, path))
            r = await c.reply()
            assert r.status == status, (path, r)
            body = r.json()
            if status == 404:
                assert body["error"]["code"] == "unknown_url"  # type: ignore[index]
        await c.aclose()
