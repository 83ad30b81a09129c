"""worker/prompt_store.py: saved prompts in host memory within a byte budget, the choice of
the one that serves a prompt, and the files that outlive a worker (issue 24, item 3)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from worker.prompt_store import DiskStore, HostCache, Saved, best_saved, fingerprint


def saved(tokens: list[int], size: int = 10, used: int = 0) -> Saved:
    return Saved(tokens=tokens, data=bytes([len(tokens) % 256]) * size, used=used)


def test_host_memory_keeps_within_its_budget_least_recently_used_first_out() -> None:
    host = HostCache(budget=25)
    a, b, c = saved([1], used=1), saved([2], used=2), saved([3], used=3)
    for s in (a, b, c):
        host.put(s)
    assert host.entries == [b, c] and host.bytes == 20 and host.evictions == 1
    assert not host.put(saved([4], size=26)), "a prompt over the whole budget is not kept"


def test_a_smaller_budget_gives_up_the_least_recently_used_at_once() -> None:
    """The supervisor's share of prompt_cache_budget shrank (SetCacheBudget)."""
    host = HostCache(300)
    for i in range(3):
        assert host.put(saved([i, i + 1], 100, used=i))
    host.resize(150)
    assert [s.used for s in host.entries] == [2] and host.bytes == 100 and host.evictions == 2
    host.resize(1000)  # a larger one keeps what there is and takes more
    assert host.put(saved([7, 8], 500, used=9)) and host.bytes == 600


def test_a_saved_prompt_that_another_continues_is_not_kept_twice() -> None:
    host = HostCache(budget=100)
    short, long = saved([1, 2], used=1), saved([1, 2, 3], used=2)
    host.put(short)
    host.put(long)
    assert host.entries == [long]
    assert not host.put(saved([1, 2], used=5))
    assert host.entries == [long] and long.used == 5


@given(
    puts=st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=4), st.integers(1, 30)), max_size=20),
    budget=st.integers(0, 60),
)
def test_host_memory_never_exceeds_its_budget_and_counts_its_bytes(puts: list[tuple[list[int], int]], budget: int) -> None:
    host = HostCache(budget)
    for i, (tokens, size) in enumerate(puts):
        host.put(saved(tokens, size, used=i))
        assert host.bytes == sum(len(s.data) for s in host.entries) <= budget
        assert [s.used for s in host.entries] == sorted(s.used for s in host.entries)


def test_the_saved_prompt_chosen_is_the_longest_prefix_beyond_what_the_kv_cache_gives() -> None:
    a, b = saved([1, 2, 3]), saved([1, 2, 3, 4, 5])
    prompt = [1, 2, 3, 4, 5, 6]
    assert best_saved([a, b], prompt, at_least=0, whole_only=False) == (b, 5)
    assert best_saved([a, b], prompt, at_least=5, whole_only=False) is None
    # A sliding-window model keeps only a sequence's last cells: a saved prompt serves only
    # one that continues it.
    assert best_saved([b], [1, 2, 3, 9], at_least=0, whole_only=True) is None
    assert best_saved([b], [1, 2, 3, 9], at_least=0, whole_only=False) == (b, 3)
    # The prompt itself again: all but its last token, whose logits are needed.
    assert best_saved([b], [1, 2, 3, 4, 5], at_least=0, whole_only=True) == (b, 4)


def test_files_round_trip_hottest_first_within_the_budget(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "m", "fp", budget=25)
    hot, warm, cold = saved([1, 2], used=9), saved([3], used=5), saved([4, 5, 6], used=1)
    assert store.save([hot, warm, cold]) == (2, 20)
    back = store.load(limit=100)
    assert [(s.tokens, s.data, s.used) for s in back] == [(hot.tokens, hot.data, 9), (warm.tokens, warm.data, 5)]
    assert store.load(limit=10) and len(store.load(limit=10)) == 1
    # A later save leaves only its own files.
    store.save([cold])
    assert [s.tokens for s in store.load(limit=100)] == [[4, 5, 6]]


def test_files_of_another_model_template_or_build_and_torn_files_are_removed(tmp_path: Path) -> None:
    DiskStore(tmp_path, "old", budget=100).save([saved([1, 2])])
    (tmp_path / "torn.prompt").write_bytes(b"corral-prompt 1\n\x05\x00")
    (tmp_path / "junk.prompt").write_bytes(b"not ours")
    assert DiskStore(tmp_path, "new", budget=100).load(limit=100) == []
    assert list(tmp_path.glob("*.prompt")) == []


def test_no_temporary_file_is_left_and_none_is_read(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, "fp", budget=100)
    store.save([saved([1])])
    assert [p.suffix for p in tmp_path.iterdir()] == [".prompt"]


def test_the_fingerprint_follows_the_model_file_the_template_and_the_build(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    base = fingerprint(str(model), "t", "0.3.36", "n_ctx=1")
    assert base == fingerprint(str(model), "t", "0.3.36", "n_ctx=1")
    assert base != fingerprint(str(model), "other template", "0.3.36", "n_ctx=1")
    assert base != fingerprint(str(model), "t", "0.3.37", "n_ctx=1")
    assert base != fingerprint(str(model), "t", "0.3.36", "n_ctx=2")
    model.write_bytes(b"xy")
    assert base != fingerprint(str(model), "t", "0.3.36", "n_ctx=1")


def test_the_same_tokens_of_two_cache_scopes_are_kept_apart(tmp_path: Path) -> None:
    # Issue 40: a saved prompt serves only its own scope's prompts (router/server/cache_scope.py);
    # one scope's copy of a prompt must not stand in for another's, nor push it out.
    cache = HostCache(budget=1000)
    alice, bob = Saved([1, 2, 3], b"a" * 10, used=1, scope="alice"), Saved([1, 2, 3, 4], b"b" * 10, used=2, scope="bob")
    assert cache.put(alice) and cache.put(bob)
    assert cache.entries == [alice, bob]  # bob's continues alice's, yet both are kept
    store = DiskStore(tmp_path, "fp", budget=100)
    assert store.save([alice, Saved([1, 2, 3], b"c" * 10, used=3, scope="bob")]) == (2, 20)
    assert sorted((s.scope, s.data) for s in store.load(limit=100)) == [("alice", b"a" * 10), ("bob", b"c" * 10)]
