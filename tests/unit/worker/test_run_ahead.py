"""Which request may run ahead of the engine loop (worker/run_ahead.py, `lone_request`).

A request that runs ahead skips the full step's admission, siblings and shared logits, so
every reason the full step has to treat a request specially must keep it out."""

from __future__ import annotations

import pytest

from worker.protocol import SamplingParams
from worker.request import Request
from worker.run_ahead import lone_request
from worker.slots import Slot
from worker.stops import StopMatcher

PROMPT = [2, 10, 11, 12]


def generating(slot: Slot[Request], **params: object) -> Request:
    """A request in `slot` that sampled its first token, pending in its cache."""
    req = Request(id=1, params=SamplingParams(**params), prompt=list(PROMPT), max_new=50, stops=StopMatcher(()))  # type: ignore[arg-type]
    req.slot, slot.request = slot, req
    slot.cache[:] = PROMPT
    req.tokens.append(99)
    req.n_gen = 1
    return req


def slots(n: int = 4) -> list[Slot[Request]]:
    return [Slot(seq_id=i, id=i) for i in range(n)]


def test_a_lone_generating_request_runs_ahead() -> None:
    ss = slots()
    req = generating(ss[2])
    assert lone_request(ss, waiting=False, draft_model=False) is req


def test_nothing_runs_ahead_without_a_request_or_beside_another() -> None:
    ss = slots()
    assert lone_request(ss, waiting=False, draft_model=False) is None
    generating(ss[0])
    generating(ss[3])
    assert lone_request(ss, waiting=False, draft_model=False) is None


def test_a_waiting_request_or_a_draft_model_keeps_it_in_the_full_step() -> None:
    ss = slots()
    generating(ss[1])
    assert lone_request(ss, waiting=True, draft_model=False) is None
    assert lone_request(ss, waiting=False, draft_model=True) is None


def test_a_request_still_prefilling_or_redecoding_does_not_run_ahead() -> None:
    ss = slots()
    req = generating(ss[0])
    req.n_gen = 0  # its prompt's logits are not sampled yet
    assert lone_request(ss, waiting=False, draft_model=False) is None
    req.n_gen = 1
    del ss[0].cache[2:]  # preempted or repaired: prompt and output decode again
    assert lone_request(ss, waiting=False, draft_model=False) is None


@pytest.mark.parametrize(
    "params", [{"logprobs": 2}, {"logit_bias": {5: 1.0}}], ids=["logprobs", "logit_bias"]
)
def test_a_request_that_reads_or_edits_its_logits_stays_in_the_full_step(params: dict[str, object]) -> None:
    ss = slots()
    generating(ss[0], **params)
    assert lone_request(ss, waiting=False, draft_model=False) is None


def test_a_request_under_a_grammar_stays_in_the_full_step() -> None:
    ss = slots()
    req = generating(ss[0])
    req.matcher = object()  # type: ignore[assignment]  # only its presence is read
    assert lone_request(ss, waiting=False, draft_model=False) is None


def test_a_sibling_sharing_a_prompt_or_awaiting_a_prefix_does_not_run_ahead() -> None:
    ss = slots()
    req = generating(ss[0])
    other = Request(id=2, params=SamplingParams(), prompt=list(PROMPT), max_new=5, stops=StopMatcher(()))
    req.follows = other
    assert lone_request(ss, waiting=False, draft_model=False) is None
    req.follows, req.awaits = None, other
    assert lone_request(ss, waiting=False, draft_model=False) is None
