"""Randomized mixes of requests at the KV cache's limits, on the real demo model, and after
each mix the same greedy request must answer as it did on a fresh engine (issue 20, item 1).

gemma-3 has a 512-token sliding window; with n_ctx 1024 (CORRAL_KV_MIX_N_CTX) sequences
outgrow it, the cache fills, and the engine purges idle caches, halves batches and
preempts. Each mix draws concurrent prompts that share the canary's template prefix (so the
canary's prefix reuse is at stake), prompts that share a long system prompt (parked
entries, anchors, and waiting for another request's prefill are at stake: issue 24), plain
prompts, prompts near the limit, conversations moved out to host memory and back, repeats and extensions of earlier prompts (whose answers n-gram drafts guess: speculative decoding is
on, as in the worker, and gives back the cells of rejected drafts), n > 1 siblings, sampled and greedy requests, staggered
starts and cancellations, requests of three classes (a better one parks a worse one's cells:
issue 44), requests under LoRA adapter sets (two random-weight adapters at two scales: the
sets take turns step by step, issue 45); a request alone runs ahead of the engine loop
(worker/run_ahead.py). Requests come from several cache scopes (router/server/cache_scope.py:
keys that share nothing). After each mix:
- no request was served cached tokens that only another scope's, or another adapter set's,
  prompts hold (issues 40 and 45), and no decode placed cells in another set's sequence;
- the engine's own check, run before every decode, found nothing to repair;
- every sequence's books (slots, parked entries, free ids) match the cells of both KV
  caches, read from llama.cpp's state;
- the canary greedy request gives the tokens it gave on the fresh engine.

`make test` runs CORRAL_KV_MIXES mixes (default 3); `make test-long` 60, a longer run thousands.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import DEMO_MODEL
from tests.e2e.engine_driver import EngineDriver
from tests.e2e.lora_assets import adapters
from worker.prompt_cache import CacheOptions
from worker.protocol import LoraAdapter, WorkerSpec
from worker.slots import common_prefix

N_CTX = int(os.environ.get("CORRAL_KV_MIX_N_CTX", "1024"))
Key = tuple[str, tuple[tuple[int, float], ...]]  # a cache scope and an adapter set (Ask.cache_key)
MIXES = int(os.environ.get("CORRAL_KV_MIXES", "3"))
# The canary: a chat turn's head, which every prompt of a mix may share, and a text whose
# greedy continuation has a wide margin at every token. llama.cpp's CPU logits for the same
# text differ by up to 0.3 between batch shapes and cell layouts (measured here: a prompt
# decoded in one batch, token by token, or after a kept prefix), so a canary with a near
# tie would flip with no bug at all: "Name three colours of the rainbow." had a margin of
# 0.02. This one's smallest margin is about 1.8, and with the 4-token head's sliding-window
# cells gone (issue 20) it answers "H I J K I K I K ..." instead of "H I J K L M ...".
CANARY_TEXT = "<start_of_turn>user\nWrite the alphabet: A B C D E F G"
CANARY_TOKENS = 16
MIN_MARGIN = 1.0
SHARED = min(600, N_CTX // 2)  # the "shared" prompts' common prefix


@dataclass(frozen=True)
class Ask:
    kind: str  # "head": the canary's template prefix + corpus; "plain"; "near": near n_ctx
    # (after the head when `seed` is even); "shared": a long common prefix, then its own;
    # "again": an earlier prompt of the mix, or that prompt extended
    length: int
    offset: int
    max_tokens: int
    n: int
    temperature: float
    seed: int
    delay: float  # seconds after the mix starts
    cancel_after: float | None  # seconds after its own start
    hold: bool = False  # a non-streaming client's: events after the first come at the end
    scope: str = ""  # its cache scope: another scope's cells must never serve it
    priority: int = 1  # its class: a better one parks a worse one's running request (issue 44)
    adapters: tuple[tuple[int, float], ...] = ()  # its LoRA set (issue 45)

    @property
    def cache_key(self) -> tuple[str, tuple[tuple[int, float], ...]]:
        """Whose cells it may reuse: its scope's, under its adapter set."""
        return self.scope, self.adapters


asks = st.builds(
    Ask,
    kind=st.sampled_from(["head", "head", "plain", "near", "again", "shared", "shared"]),
    length=st.integers(1, N_CTX - 100),
    offset=st.integers(0, 2000),
    max_tokens=st.integers(0, 40),
    n=st.sampled_from([1, 1, 1, 2, 3]),
    temperature=st.sampled_from([0.0, 0.0, 0.9]),
    seed=st.integers(0, 2**16),
    delay=st.sampled_from([0.0, 0.0, 0.05, 0.3, 0.8]),
    cancel_after=st.one_of(st.none(), st.none(), st.floats(0.0, 1.5)),
    hold=st.booleans(),
    scope=st.sampled_from(["", "", "alice", "bob"]),
    priority=st.sampled_from([1, 1, 0, 2]),
    adapters=st.sampled_from([(), (), ((0, 1.0),), ((0, 0.5),), ((1, 1.0),)]),
)


class Mixer:
    def __init__(self, folder: Path, draft_model: str | None = None) -> None:
        if not DEMO_MODEL.is_file():
            pytest.fail(f"demo model missing at {DEMO_MODEL}: run `make model` (make test does)")
        # With host memory for saved prompts, as a worker has by default: entries the KV
        # cache gives up, or that go unused, move there and come back (worker/prompt_cache.py).
        a, b = adapters(folder)
        self.d = EngineDriver(
            WorkerSpec(
                name="mix", path=str(DEMO_MODEL), slots=4, n_ctx=N_CTX, n_batch=256, draft_model=draft_model,
                lora=[LoraAdapter(path=str(a)), LoraAdapter(path=str(b))],
            ),
            cache=CacheOptions(ram_bytes=1 << 28),
        )
        m = self.d.model
        # The last mixes' prompts with their replies, each with its cache scope and set.
        self.conversations: list[tuple[Key, list[int]]] = []
        # Every prompt sent, with each choice's tokens after it, by cache scope and adapter
        # set: what a scope's cells can hold (parked entries and host memory outlive a mix).
        self.sent: dict[Key, list[list[int]]] = {}
        self.canary = m.tokenize(CANARY_TEXT, add_special=True, parse_special=True)
        self.head = self.canary[:4]  # <bos><start_of_turn>user\n, as every chat prompt begins
        text = " ".join(f"Item {i}: the {w} river runs past {i * 7} stones." for i, w in
                        zip(range(400), ["red", "cold", "long", "quiet", "old"] * 80))
        self.corpus = m.tokenize(text, add_special=False, parse_special=False)
        assert len(self.corpus) > 2000 + N_CTX
        fresh = self.d.run_alone(self.canary, CANARY_TOKENS)
        self.fresh = fresh.tokens[0]
        assert len(self.fresh) == CANARY_TOKENS
        margins = [lp.logprob - max(t.logprob for t in lp.top if t.token != lp.token) for lp in fresh.logprobs[0]]
        assert min(margins) >= MIN_MARGIN, f"the canary has near ties, it would flip on numerics alone: {margins}"

    def prompt(self, ask: Ask, earlier: list[tuple[Key, list[int]]]) -> list[int]:
        body = self.corpus[ask.offset : ask.offset + ask.length]
        if ask.kind == "head":
            return self.head + body
        if ask.kind == "near":  # a chat turn half the time, as in issue 20
            head = self.head if ask.seed % 2 == 0 else []
            return head + self.corpus[ask.offset : ask.offset + N_CTX - 1 - len(head) - ask.length % 60]
        if ask.kind == "shared":
            # A long system prompt that several prompts of a mix share, then a question of
            # their own: what parked entries, anchors and waiting for a prefill serve
            # (worker/prefix_reuse.py). It is longer than the sliding window, so a copy
            # needs the window's cells.
            return self.head + self.corpus[:SHARED] + body[: ask.length % 90 + 1]
        if ask.kind == "again" and earlier:
            base = earlier[ask.seed % len(earlier)][1]
            return base if ask.length % 2 else base + body[: ask.length % 200 + 1]
        return body

    def run(self, mix: list[Ask]) -> None:
        d = self.d
        repairs = d.engine.kv.repairs
        draft_repairs = d.draft.repairs if d.draft is not None else 0
        # "again" may also continue a conversation of an earlier mix (its prompt and the
        # reply): by then the KV cache has usually given it up to host memory, and it is
        # written back from there (worker/prompt_cache.py).
        earlier = list(self.conversations)
        timeline = sorted(enumerate(mix), key=lambda p: p[1].delay)
        t0 = time.monotonic()
        started: list[tuple[int, float, Ask]] = []
        outcomes = []
        for _, ask in timeline:
            time.sleep(max(0.0, t0 + ask.delay - time.monotonic()))
            tokens = self.prompt(ask, earlier)
            earlier.append((ask.cache_key, tokens))
            seed = ask.seed if ask.temperature else None
            rid, o = d.generate(
                tokens, ask.max_tokens, ask.temperature, seed, ask.n, hold=ask.hold, scope=ask.scope, priority=ask.priority,
                adapters=list(ask.adapters),
            )
            started.append((rid, time.monotonic(), ask))
            outcomes.append((rid, o, ask, tokens))
        for rid, at, ask in sorted(started, key=lambda s: s[1] + (s[2].cancel_after or 1e9)):
            if ask.cancel_after is not None:
                time.sleep(max(0.0, at + ask.cancel_after - time.monotonic()))
                d.cancel(rid)
        for rid, o, ask, tokens in outcomes:
            assert o.done.wait(300), f"request {rid} ({ask}) did not finish"
            if ask.cancel_after is None and o.error is not None:
                # Only a prompt that cannot fit may be refused.
                assert "context" in o.error or "tokens" in o.error, o.error
            if o.error is None and ask.n == 1 and o.tokens.get(0):
                self.conversations.append((ask.cache_key, tokens + o.tokens[0]))
        # What each request was served from the cache, its own scope's other prompts (and
        # their replies) under its own adapter set must hold: this mix's, the earlier
        # mixes' and the canary's.
        mine = [[(a.cache_key, t)] + [(a.cache_key, t + out) for out in o.tokens.values()] for (_, o, a, t) in outcomes]
        canary: Key = ("", ())
        for j, (rid, o, ask, tokens) in enumerate(outcomes):
            cached = o.cached.get(0, 0)
            if cached:
                others = [e for k, m in enumerate(mine) if k != j for e in m] + [(canary, self.canary + self.fresh)]
                others += [(ask.cache_key, t) for t in self.sent.get(ask.cache_key, [])]
                own = max((common_prefix(t, tokens) for s, t in others if s == ask.cache_key), default=0)
                assert cached <= own, (
                    f"request {rid} (scope {ask.scope!r}, adapters {ask.adapters}) was served {cached} cached "
                    f"tokens; its scope's prompts under its set hold {own} of them"
                )
        for m in mine:
            self.sent.setdefault(m[0][0], []).extend(t for _, t in m)
        del self.conversations[:-24]
        d.wait_idle()
        assert d.engine.kv.repairs == repairs, "the engine's KV check had to repair a slot (see the log)"
        assert d.engine.hold.holding == 0, "events of an ended request are still held"
        assert d.draft is None or d.draft.repairs == draft_repairs, "a draft sequence disagreed with its book (see the log)"
        assert d.cell_problems() == []
        again = d.run_alone(self.canary, CANARY_TOKENS).tokens[0]
        assert again == self.fresh, "the canary's greedy answer changed after the mix"
        d.wait_idle()
        assert d.cell_problems() == []


@pytest.fixture(scope="module")
def mixer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mixer]:
    yield Mixer(tmp_path_factory.mktemp("mix-lora"))


@settings(
    max_examples=MIXES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mix=st.lists(asks, min_size=1, max_size=6))
def test_no_mix_of_requests_changes_a_later_greedy_answer(mixer: Mixer, mix: list[Ask]) -> None:
    mixer.run(mix)


@pytest.fixture(scope="module")
def draft_mixer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mixer]:
    # The demo model drafting for itself: nearly every draft is taken, so that the most
    # cells move (worker/draft_model.py); the output must not change for it.
    yield Mixer(tmp_path_factory.mktemp("mix-lora"), draft_model=str(DEMO_MODEL))


@settings(
    max_examples=max(1, MIXES // 4),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mix=st.lists(asks, min_size=1, max_size=6))
def test_no_mix_with_a_draft_model_changes_a_later_greedy_answer(draft_mixer: Mixer, mix: list[Ask]) -> None:
    draft_mixer.run(mix)


def test_issue_20s_sequence_leaves_the_canary_as_a_fresh_engine_answers(mixer: Mixer) -> None:
    """The reported sequence, at this n_ctx: four ~200-token chats at once, then a prompt
    close to n_ctx, whose chunks take the sliding-window cells of the other sequences and
    of its own start; the canary then kept a template prefix whose cells were gone."""
    rng = random.Random(20)
    mix = [Ask("head", 200, rng.randint(0, 2000), 40, 1, 0.0, 0, 0.0, None) for _ in range(4)]
    mix.append(Ask("near", 5, 100, 40, 1, 0.0, 0, 0.3, None))
    mixer.run(mix)


def test_lone_streams_that_run_ahead_inside_a_mix_leave_the_books_true(mixer: Mixer) -> None:
    """A mix whose requests are alone for a while, each running ahead of the engine loop
    (worker/run_ahead.py) with drafts, until the next arrives or a cancel reaches it; the
    same checks follow."""
    before = mixer.d.engine.ahead.steps
    mixer.run([
        Ask("plain", 200, 10, 40, 1, 0.0, 1, 0.0, None),
        Ask("shared", 50, 300, 40, 1, 0.9, 7, 0.8, None, hold=True),
        Ask("again", 3, 0, 40, 1, 0.0, 2, 1.0, 0.2),
    ])
    assert mixer.d.engine.ahead.steps > before
