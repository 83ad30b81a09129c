"""Prefix reuse beyond one slot, on the real demo model (issue 24, item 2): six users on four
slots, one long system prompt shared by all, each turn resending the whole conversation.

- A user who comes back finds the whole of its conversation cached, though other users took
  every slot in between: it was parked under a sequence of its own (worker/kv_entries.py).
- The system prompt is decoded once: the first turns that arrive together wait for the one
  decoding it and copy its cells; later first turns copy them from any sequence that holds
  them. The system prompt is longer than gemma-3's 512-token sliding window, so a copy
  needs the window's cells, which an anchor entry keeps.
- After every step the engine checked every sequence's books against its cells (slots,
  parked entries and free ids), and nothing had to be repaired; after the load, each
  sequence's cells, read from llama.cpp's state, are what its books say, and a greedy canary
  answers as on a fresh engine.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.e2e.conftest import DEMO_MODEL
from tests.e2e.engine_driver import EngineDriver
from tests.e2e.test_kv_mixes import CANARY_TEXT, CANARY_TOKENS
from worker.model import LoadedModel
from worker.prefix_reuse import SPILL_AFTER
from worker.prompt_cache import SPILL_CHECK, CacheOptions
from worker.prompt_store import fingerprint
from worker.protocol import SetCacheBudget, WorkerSpec

USERS, TURNS, SLOTS, REPLY = 6, 3, 4, 8


@pytest.fixture(scope="module")
def driver() -> Iterator[EngineDriver]:
    if not DEMO_MODEL.is_file():
        pytest.fail(f"demo model missing at {DEMO_MODEL}: run `make model` (make test does)")
    yield EngineDriver(WorkerSpec(name="agents", path=str(DEMO_MODEL), slots=SLOTS, n_ctx=4096, n_batch=512))


def test_six_users_on_four_slots_decode_the_system_prompt_once_and_keep_their_conversations(
    driver: EngineDriver,
) -> None:
    m, e = driver.model, driver.engine
    fresh_canary = driver.run_alone(m.tokenize(CANARY_TEXT, add_special=True, parse_special=True), CANARY_TOKENS)
    driver.wait_idle()
    rules = " ".join(f"Rule {i}: check file {i % 17} at line {i * 7 % 101}." for i in range(70))
    system = m.tokenize(f"<start_of_turn>user\nYou are a careful assistant. {rules}\n", add_special=True, parse_special=True)
    assert len(system) > 600  # past the 512-token sliding window
    decoded_before, repairs = e.prompt_tokens_decoded, e.kv.repairs
    sent = 0
    cached: dict[tuple[int, int], int] = {}
    expected: dict[tuple[int, int], int] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def user(u: int) -> None:
        nonlocal sent
        history = list(system)
        for t in range(TURNS):
            prompt = history + m.tokenize(f"User {u} asks question {t} about file {u * 3 + t}.", add_special=False, parse_special=False)
            _, o = driver.generate(prompt, REPLY)
            if not o.done.wait(300) or o.error is not None:
                errors.append(f"user {u} turn {t}: {o.error or 'no answer'}")
                return
            with lock:
                sent += len(prompt)
                cached[u, t] = o.cached[0]
                if t > 0:
                    # The whole of the last turn but the reply's last token, sampled and
                    # never decoded.
                    expected[u, t] = len(history) - 1
            history = prompt + o.tokens[0]

    threads = [threading.Thread(target=user, args=(u,)) for u in range(USERS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    assert not errors, errors
    driver.wait_idle()

    later = {k: v for k, v in cached.items() if k[1] > 0}
    assert later == expected, f"a returning user did not find the whole of its conversation (system {len(system)}, first {cached})"
    first = [cached[u, 0] for u in range(USERS)]
    assert sum(c >= len(system) - 1 for c in first) >= USERS - 1, f"first turns' cached tokens: {first}"
    decoded = e.prompt_tokens_decoded - decoded_before
    assert decoded < len(system) + 0.15 * sent, f"decoded {decoded} of {sent} prompt tokens"
    assert e.entries.hits > 0 and e.entries.tokens_saved > 0
    assert e.kv.repairs == repairs, "the engine's KV check had to repair a sequence (see the log)"
    assert driver.cell_problems() == []
    again = driver.run_alone(m.tokenize(CANARY_TEXT, add_special=True, parse_special=True), CANARY_TOKENS)
    assert again.tokens[0] == fresh_canary.tokens[0]
    driver.wait_idle()
    assert driver.cell_problems() == []


# ---- beyond the KV cache: host memory and disk (issue 24, item 3) ---------------------------------


def _conversation(m: LoadedModel, tag: str) -> list[int]:
    text = " ".join(f"{tag} fact {i}: the {tag} list has {i * 3} entries." for i in range(40))
    return m.tokenize(f"<start_of_turn>user\n{text}\n", add_special=True, parse_special=True)


def _continue(d: EngineDriver, history: list[int], more: str) -> tuple[list[int], int]:
    """One more turn of a conversation: its whole prompt, and the tokens read from a cache."""
    prompt = history + d.model.tokenize(more, add_special=False, parse_special=False)
    o = d.run_alone(prompt, REPLY)
    return prompt + o.tokens[0], o.cached[0]


def _with_host_memory(name: str, slots: int, cached_prompts: int) -> tuple[EngineDriver, list[int]]:
    """An engine with 1 GiB of host memory for saved prompts, and the canary's greedy answer
    on it while fresh."""
    d = EngineDriver(
        WorkerSpec(name=name, path=str(DEMO_MODEL), slots=slots, cached_prompts=cached_prompts, n_ctx=4096),
        cache=CacheOptions(ram_bytes=1 << 30),
    )
    return d, _canary(d)


def _canary(d: EngineDriver) -> list[int]:
    return d.run_alone(d.model.tokenize(CANARY_TEXT, add_special=True, parse_special=True), CANARY_TOKENS).tokens[0]


def test_a_conversation_the_kv_cache_gave_up_comes_back_from_host_memory() -> None:
    d, canary = _with_host_memory("host", slots=2, cached_prompts=1)
    e = d.engine
    a, _ = _continue(d, _conversation(d.model, "alpha"), "First question?")
    # Three other conversations take both slots and the one parked entry: alpha's cells are
    # given up, and saved to host memory first.
    for tag in ("beta", "gamma", "delta"):
        _continue(d, _conversation(d.model, tag), "A question?")
    d.wait_idle()
    assert e.cache.host.entries, "nothing was saved to host memory"
    assert all(entry.cache[:20] != a[:20] for entry in (*e.slots, *e.entries.parked))
    _, cached = _continue(d, a, "Second question?")
    assert cached == len(a) - 1, "alpha's conversation was not restored whole"
    assert e.cache.restored >= 1 and e.cache.tokens_restored >= len(a) - 1
    d.wait_idle()
    assert d.cell_problems() == []
    assert e.kv.repairs == 0
    assert _canary(d) == canary
    # The supervisor's share of prompt_cache_budget shrinks to nothing: what host memory
    # held goes at once, and nothing more is kept.
    for tag in ("epsilon", "zeta", "eta"):
        _continue(d, _conversation(d.model, tag), "A question?")
    d.wait_idle()
    assert e.cache.host.bytes > 0
    e.submit(SetCacheBudget(n_bytes=0))
    d.wait_idle()
    deadline = time.monotonic() + 10
    while e.cache.host.bytes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert e.cache.host.bytes == 0 and not e.cache.host.entries
    for tag in ("theta", "iota", "kappa"):
        _continue(d, _conversation(d.model, tag), "A question?")
    d.wait_idle()
    assert e.cache.host.bytes == 0


def test_a_conversation_left_unused_moves_to_host_memory_and_comes_back_whole() -> None:
    """A parked conversation lengthens every decode step's attention while its cells are in
    the KV cache (bench/results/throughput-pairs-*): after SPILL_AFTER decode steps unused it
    moves to host memory, and its user, coming back, finds it whole there. (Which entries
    stay, the shared ones, is tests/unit/worker/test_prefix_reuse.py's.)"""
    d, canary = _with_host_memory("spill", slots=1, cached_prompts=2)
    e = d.engine
    a, _ = _continue(d, _conversation(d.model, "alpha"), "First question?")
    # Another conversation takes the one slot: alpha is parked, then left unused while the
    # other one generates for well past SPILL_AFTER steps.
    other = _conversation(d.model, "beta") + d.model.tokenize("Tell a long story.", add_special=False, parse_special=False)
    d.run_alone(other, SPILL_AFTER + 2 * SPILL_CHECK)
    d.wait_idle()
    assert e.cache.spilled_idle >= 1
    assert all(entry.cache[:20] != a[:20] for entry in (*e.slots, *e.entries.parked)), "alpha is still in the KV cache"
    assert any(item.tokens == a[: len(item.tokens)] and len(item.tokens) >= len(a) - 1 for item in e.cache.host.entries)
    assert d.cell_problems() == []
    _, cached = _continue(d, a, "Second question?")
    assert cached == len(a) - 1, "alpha's conversation was not restored whole"
    assert e.cache.restored >= 1
    d.wait_idle()
    assert d.cell_problems() == [] and e.kv.repairs == 0
    assert _canary(d) == canary


def test_the_hottest_conversations_outlive_the_worker_on_disk(tmp_path: Path) -> None:
    spec = WorkerSpec(name="disk", path=str(DEMO_MODEL), slots=2, n_ctx=4096)
    fp = fingerprint(spec.path, "gemma", "test", "layout")
    options = CacheOptions(ram_bytes=1 << 30, folder=tmp_path / "disk", disk_bytes=1 << 30, fingerprint=fp)
    first = EngineDriver(spec, cache=options)
    a, _ = _continue(first, _conversation(first.model, "alpha"), "First question?")
    b, _ = _continue(first, _conversation(first.model, "beta"), "First question?")
    first.wait_idle()
    assert first.engine.persist(30)
    assert len(list((tmp_path / "disk").glob("*.prompt"))) >= 2

    # The next run of the worker reads them back before its first request.
    second = EngineDriver(spec, cache=options)
    _, cached = _continue(second, a, "Second question?")
    assert cached == len(a) - 1, "the first turn after a restart did not find its conversation"
    _, cached = _continue(second, b, "Second question?")
    assert cached == len(b) - 1
    assert second.engine.cache.loaded_from_disk >= 2 and second.engine.cache.restored >= 2
    second.wait_idle()
    assert second.cell_problems() == []
    assert second.engine.kv.repairs == 0

    # Another template (or model file, or build) makes them worthless: removed, not served.
    other = CacheOptions(ram_bytes=1 << 30, folder=tmp_path / "disk", disk_bytes=1 << 30, fingerprint="another")
    third = EngineDriver(spec, cache=other)
    _, cached = _continue(third, a, "Second question?")
    assert cached < 10
    assert third.engine.cache.loaded_from_disk == 0
