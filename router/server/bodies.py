"""Request bodies, read once and without a copy.

Quart keeps a body in a bytearray and hands out a fresh `bytes` copy of all of it on every
`get_data()`. On this machine a copy of 15 MB costs 13 ms, with the event loop, and so every
stream the router serves, standing still. msgspec decodes a bytearray as it is, so the
buffer is taken over instead: the body is read whole, once, and Quart's copy is left empty.
"""

from __future__ import annotations

import math

import trio
from quart import request
from quart_trio.wrappers.request import TrioBody, TrioRequest
from werkzeug.exceptions import RequestTimeout


class WholeBody(TrioBody):
    async def take(self) -> bytearray:
        """The whole body, once it has arrived, handed over as it is. Raises
        RequestEntityTooLarge past the body limit. The body is empty afterwards."""
        if self._must_raise is not None:
            raise self._must_raise
        await self._complete.wait()
        if self._must_raise is not None:
            raise self._must_raise
        data, self._data = self._data, bytearray()
        return data

    def put_back(self, data: bytearray) -> None:
        """Hand a taken body back, for the next reader (a hook that looked at it first)."""
        self._data = data


class CorralRequest(TrioRequest):
    body_class = WholeBody


async def read_body() -> bytearray:
    """The current request's body (the app's request_class must be CorralRequest).
    Raises RequestTimeout (408) if it has not arrived within BODY_TIMEOUT."""
    body = request.body
    assert isinstance(body, WholeBody), "create_app sets request_class = CorralRequest"
    with trio.move_on_after(request.body_timeout or math.inf):
        return await body.take()
    raise RequestTimeout()


def put_back(body: bytearray) -> None:
    """Give the current request's body back after `read_body`, so that the route reads it."""
    taken = request.body
    assert isinstance(taken, WholeBody), "create_app sets request_class = CorralRequest"
    taken.put_back(body)
