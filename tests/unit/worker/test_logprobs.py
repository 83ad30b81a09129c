"""worker/logprobs.py: logprobs from the logits the sampler used, and their release in step
with the text that reaches the client (issue 10, item 4)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from worker.logits import LogitBias
from worker.logprobs import LogprobQueue, log_softmax_at, token_logprob
from worker.protocol import TokenLogprob


def lp(token: int) -> TokenLogprob:
    return TokenLogprob(token=token, piece=b"", logprob=-1.0)


def test_log_softmax_matches_the_definition_and_orders_the_top() -> None:
    logits = np.array([1.0, 3.0, 2.0, -1.0, 3.5], dtype=np.float32)
    want = logits - math.log(sum(math.exp(x) for x in logits))
    got, top = log_softmax_at(logits, 2, 3)
    assert got == pytest.approx(want[2], abs=1e-6)
    assert [t for t, _ in top] == [4, 1, 2]
    assert [v for _, v in top] == pytest.approx([want[4], want[1], want[2]], abs=1e-6)
    assert log_softmax_at(logits, 0, 0)[1] == []
    assert len(log_softmax_at(logits, 0, 99)[1]) == 5  # k past the vocabulary: all of it


def test_the_log_softmax_survives_huge_logits_and_banned_tokens() -> None:
    logits = np.array([1000.0, 999.0, -np.inf], dtype=np.float32)
    got, top = log_softmax_at(logits, 0, 3)
    assert got == pytest.approx(-math.log(1 + math.exp(-1)), abs=1e-5)
    assert top[-1][0] == 2 and top[-1][1] == -math.inf
    # The wire form has no infinity (JSON cannot carry it): OpenAI's -9999 instead.
    wire = token_logprob(logits, 2, 3, lambda t: bytes([65 + t]))
    assert wire.logprob == -9999.0 and wire.piece == b"C"
    assert [t.piece for t in wire.top] == [b"A", b"B", b"C"]


def test_bias_is_added_in_place_and_changes_the_argmax() -> None:
    logits = np.array([0.0, 5.0, 4.0], dtype=np.float32)
    LogitBias({1: -100.0, 2: 0.5}).apply(logits)
    assert logits.tolist() == [0.0, -95.0, 4.5]
    assert int(np.argmax(logits)) == 2
    LogitBias({}).apply(logits)
    assert logits.tolist() == [0.0, -95.0, 4.5]


def test_logprobs_leave_with_their_tokens_text() -> None:
    q = LogprobQueue()
    q.push(lp(1), 5)  # "Hello"
    assert [e.token for e in q.release(5)] == [1]
    q.push(lp(2), 1)  # " " held back: it may start a stop string
    assert q.release(0) == []
    q.push(lp(3), 5)  # "world": the hold is decided, both go
    assert [e.token for e in q.release(6)] == [2, 3]


def test_a_token_that_completes_no_character_waits_for_the_one_that_does() -> None:
    """An emoji arrives as single-byte pieces: the first pieces decode to nothing yet."""
    q = LogprobQueue()
    q.push(lp(1), 0)
    q.push(lp(2), 0)
    assert q.release(0) == []
    q.push(lp(3), 1)
    assert [e.token for e in q.release(1)] == [1, 2, 3]


def test_a_stop_strings_tokens_never_leave() -> None:
    q = LogprobQueue()
    q.push(lp(1), 3)  # "The"
    q.push(lp(2), 4)  # " end": the stop string " end" matched; the text out is "The"
    assert [e.token for e in q.release(3)] == [1]
    q.drop()
    assert q.release_all() == []


def test_release_all_flushes_held_tokens_when_generation_ends_otherwise() -> None:
    q = LogprobQueue()
    q.push(lp(1), 2)
    q.push(lp(2), 0)
    assert [e.token for e in q.release_all()] == [1, 2]
