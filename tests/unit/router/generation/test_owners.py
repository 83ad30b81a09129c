"""router/generation/owners.py: the book of who sent each generation in flight, per worker
connection (issue 40, finding 5: GET /slots shows a request to its own key only)."""

from __future__ import annotations

import gc
import weakref
from typing import cast

from router.generation import owners
from supervisor.connection import WorkerConnection


class Conn:
    """Stands for a WorkerConnection: the book only keys on it."""


def _conn() -> WorkerConnection:
    return cast(WorkerConnection, Conn())


def test_each_connection_has_its_own_book_and_forgets_what_ended() -> None:
    a, b = _conn(), _conn()
    owners.enter(a, 1, "alice")
    owners.enter(b, 1, None)  # ids start again at 1 in each worker
    assert owners.owner_of(a, 1) == "alice"
    assert owners.owner_of(b, 1) is None
    assert owners.owner_of(a, 2) is None  # not in the book: shown to admin keys only
    owners.remove(a, 1)
    owners.remove(a, 1)  # twice, as a close that runs again does
    assert owners.owner_of(a, 1) is None


def test_a_connection_that_is_gone_takes_its_book_along() -> None:
    # Counting the books before and after raced with other tests' connections, which the
    # same collection may take (seen once in a full run): the book must not keep this one.
    conn = _conn()
    owners.enter(conn, 7, "bob")
    gone = weakref.ref(conn)
    assert any(c is conn for c in list(owners._books))
    del conn
    gc.collect()
    assert gone() is None
