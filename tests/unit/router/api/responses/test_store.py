"""router/api/responses/store.py: responses kept for a while, within a size cap, for the key
that made them."""

from __future__ import annotations

from router.api.responses.store import ResponseStore
from worker.protocol import ChatMessage

TURNS = (ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="hello"))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_response_is_kept_for_its_ttl_then_forgotten() -> None:
    clock = Clock()
    s = ResponseStore(clock)
    assert s.put("resp_a", None, b"{}", TURNS, ttl=60, max_bytes=10_000)
    clock.now += 59
    item = s.get("resp_a", None, ttl=60)
    assert item is not None and item.conversation == TURNS and item.response == b"{}"
    clock.now += 2
    assert s.get("resp_a", None, ttl=60) is None and len(s) == 0 and s.size == 0


def test_the_oldest_go_first_past_the_size_cap() -> None:
    s = ResponseStore(Clock())
    one = len(b"x" * 100) + 0
    for i in range(5):
        assert s.put(f"resp_{i}", None, b"x" * 100, TURNS, ttl=60, max_bytes=10_000)
    per_item = s.size // 5
    assert per_item > one
    assert s.put("resp_5", None, b"x" * 100, TURNS, ttl=60, max_bytes=per_item * 3)
    assert [i for i in range(6) if s.get(f"resp_{i}", None, ttl=60)] == [3, 4, 5]
    assert s.size <= per_item * 3


def test_one_larger_than_the_cap_or_a_zero_ttl_is_not_kept() -> None:
    s = ResponseStore(Clock())
    assert not s.put("resp_big", None, b"x" * 1000, TURNS, ttl=60, max_bytes=500)
    assert not s.put("resp_a", None, b"{}", TURNS, ttl=0, max_bytes=10_000)
    assert len(s) == 0


def test_another_key_sees_no_such_response_and_cannot_delete_it() -> None:
    s = ResponseStore(Clock())
    s.put("resp_a", "alice", b"{}", TURNS, ttl=60, max_bytes=10_000)
    assert s.get("resp_a", "bob", ttl=60) is None and s.get("resp_a", None, ttl=60) is None
    assert not s.delete("resp_a", "bob", ttl=60)
    assert s.delete("resp_a", "alice", ttl=60) and s.get("resp_a", "alice", ttl=60) is None
