"""Responses kept for `previous_response_id` and GET /v1/responses/{id}: in memory, each
for `ttl` seconds after it was made, and at most `max_bytes` of them in all
([server] responses_ttl, responses_max_bytes).

A response is kept with its conversation (the messages it answered, its predecessors'
included, and its own output as the assistant's turn), so that a follow-up continues it
without walking a chain; and with the identity of the key that made it (its digest, not
its name: a name is for people, and a second key could be given it): another key sees no
such response, as a key limited to some models sees no others.

Past `max_bytes`, the owner that holds the most bytes loses its oldest response first. So
one key sending large responses ends up pushing out its own, and a key never loses a
response to another while it holds fewer bytes than that one (a max-min fair share of the
store, with no share to configure).

Pure: the clock is passed in, so expiry is tested without waiting.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import msgspec

from worker.protocol import ChatMessage

_encode = msgspec.msgpack.Encoder().encode


@dataclass(frozen=True)
class Stored:
    id: str
    owner: str | None  # the key's identity, Key.owner (None: made without a key)
    response: bytes  # the response object, as it was answered (JSON)
    conversation: tuple[ChatMessage, ...]  # without the request's instructions, as OpenAI carries it
    made: float
    size: int


class ResponseStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._items: OrderedDict[str, Stored] = OrderedDict()  # oldest first
        self._bytes = 0
        self._held: dict[str | None, int] = {}  # owner -> bytes it holds

    @property
    def size(self) -> int:
        """The bytes kept, in all."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def put(
        self, id: str, owner: str | None, response: bytes, conversation: tuple[ChatMessage, ...],
        ttl: float, max_bytes: int,
    ) -> bool:
        """Keep a response; False when it is larger than `max_bytes` alone (or nothing is
        kept: ttl or max_bytes 0), so that it cannot be found."""
        self._expire(ttl)
        size = len(response) + len(_encode(conversation))
        if ttl <= 0 or size > max_bytes:
            return False
        self._drop(id)
        self._items[id] = Stored(id, owner, response, conversation, self._clock(), size)
        self._bytes += size
        self._held[owner] = self._held.get(owner, 0) + size
        while self._bytes > max_bytes:
            self._drop(self._oldest_of(max(self._held, key=self._held.__getitem__)))
        return True

    def held(self, owner: str | None) -> int:
        """The bytes `owner`'s responses take."""
        return self._held.get(owner, 0)

    def _oldest_of(self, owner: str | None) -> str:
        # Oldest first: the walk stops at the owner's first. Owners are few (the keys), and
        # the walk runs only when the store is full.
        return next(item.id for item in self._items.values() if item.owner == owner)

    def get(self, id: str, owner: str | None, ttl: float) -> Stored | None:
        """The response, if it is kept, unexpired, and was made by `owner`'s key."""
        self._expire(ttl)
        item = self._items.get(id)
        return item if item is not None and item.owner == owner else None

    def delete(self, id: str, owner: str | None, ttl: float) -> bool:
        if self.get(id, owner, ttl) is None:
            return False
        self._drop(id)
        return True

    def _expire(self, ttl: float) -> None:
        # Oldest first, so the first unexpired one ends the walk.
        deadline = self._clock() - ttl
        while self._items:
            first = next(iter(self._items.values()))
            if first.made > deadline:
                break
            self._drop(first.id)

    def _drop(self, id: str) -> None:
        item = self._items.pop(id, None)
        if item is not None:
            self._bytes -= item.size
            left = self._held[item.owner] - item.size
            if left:
                self._held[item.owner] = left
            else:
                del self._held[item.owner]
