"""Who sent each generation in flight on each worker, by the id the worker knows it by
(llama-server's `id_task` in GET /slots).

The worker never learns which key sent a request (the wire protocol carries none), so the
router keeps the book: `Generation` enters each Generate it sends and removes it when it
closes, and GET /slots shows a busy slot's request only to the key that sent it
(router/server/steering.py). Kept per connection, and weakly: a worker's ids start again
at 1 in each worker, and a connection that is gone takes its entries with it.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from supervisor.connection import WorkerConnection

# connection -> request id -> the sending key's owner (Key.owner), None for no key
_books: WeakKeyDictionary[WorkerConnection, dict[int, str | None]] = WeakKeyDictionary()


def enter(conn: WorkerConnection, rid: int, owner: str | None) -> None:
    """Request `rid` on `conn` was sent by the key whose owner is `owner`."""
    _books.setdefault(conn, {})[rid] = owner


def remove(conn: WorkerConnection, rid: int) -> None:
    """Request `rid` on `conn` is over (or was never entered)."""
    book = _books.get(conn)
    if book is not None:
        book.pop(rid, None)


def owner_of(conn: WorkerConnection, rid: int) -> str | None:
    """The owner of request `rid` on `conn`; None for a request sent without a key, or
    one not in the book (just ended, or not a generation): shown to admin keys only."""
    book = _books.get(conn)
    return None if book is None else book.get(rid)
