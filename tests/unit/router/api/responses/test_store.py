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


def test_one_key_filling_the_store_pushes_out_its_own_responses_not_another_keys() -> None:
    # Issue 40: three large requests from one key emptied another key's responses.
    s = ResponseStore(Clock())
    assert s.put("resp_b", "bob", b"b" * 100, TURNS, ttl=60, max_bytes=2_000)
    for i in range(30):
        assert s.put(f"resp_a{i}", "mallory", b"m" * 300, TURNS, ttl=60, max_bytes=2_000)
    assert s.get("resp_b", "bob", ttl=60) is not None
    assert s.size <= 2_000
    assert s.get("resp_a29", "mallory", ttl=60) is not None and s.get("resp_a0", "mallory", ttl=60) is None


def test_the_largest_holder_gives_up_its_oldest_first() -> None:
    s = ResponseStore(Clock())
    for i in range(3):
        s.put(f"resp_b{i}", "bob", b"b" * 200, TURNS, ttl=60, max_bytes=10_000)
    s.put("resp_c", "carol", b"c" * 100, TURNS, ttl=60, max_bytes=10_000)
    per_b = s.held("bob") // 3
    # Past the cap, bob (who holds the most) loses his oldest; carol keeps hers.
    assert s.put("resp_c2", "carol", b"c" * 100, TURNS, ttl=60, max_bytes=s.size)
    assert s.get("resp_b0", "bob", ttl=60) is None and s.get("resp_b1", "bob", ttl=60) is not None
    assert s.get("resp_c", "carol", ttl=60) is not None and s.get("resp_c2", "carol", ttl=60) is not None
    assert s.held("bob") == 2 * per_b
    assert s.held("bob") + s.held("carol") == s.size
