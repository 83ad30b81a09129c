"""worker/preparer.py: requests are prepared on their own thread, in order, at a lower
priority, and a Cancel drops a request wherever it is, with no work wasted on it."""

from __future__ import annotations

import os
import queue
import threading

import pytest

from worker.chat_template import ChatTemplate
from worker.constraint import Matcher
from worker.preparer import NICE, Compile, Preparer
from worker.protocol import Constraint, Embed, Error, Frame, Generate, SamplingParams, Tokenize, TokenizeResult
from worker.request import EmbedJob, Request

WAIT = 5.0


class GatedModel:
    """A fake model whose tokenizer blocks on texts starting with "gate" until released."""

    def __init__(self, pooling: str | None = None) -> None:
        self.template: ChatTemplate | None = None
        self.n_batch = 64
        self.n_embd = 8
        self.pooling = pooling
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.tokenized: list[str] = []

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        if text.startswith("boom"):
            raise RuntimeError("tokenizer bug")
        if text.startswith("gate"):
            self.entered.set()
            assert self.gate.wait(WAIT)
        self.tokenized.append(text)
        return ([2] if add_special else []) + list(text.encode())

    def max_token_bytes(self) -> int | None:
        return 48


class Harness:
    def __init__(self, model: GatedModel, embeddings: bool = False, constrain: Compile | None = None) -> None:
        self.model = model
        self.delivered: queue.SimpleQueue[Request | EmbedJob] = queue.SimpleQueue()
        self.emitted: queue.SimpleQueue[Frame] = queue.SimpleQueue()
        self.prep = Preparer(model, 4096, embeddings, self.delivered.put, self.emitted.put, constrain)
        self.prep.start()

    def settle(self) -> None:
        """Wait until everything submitted so far has been prepared or dropped: frames are
        prepared in order, so a marker's answer comes after all of theirs."""
        self.prep.submit(Tokenize(id=-1, text="marker"))
        others = []
        while not isinstance(frame := self.emitted.get(timeout=WAIT), TokenizeResult) or frame.id != -1:
            others.append(frame)
        for frame in others:  # kept for the test
            self.emitted.put(frame)

    def drain(self) -> tuple[list[Request | EmbedJob], list[Frame]]:
        delivered, emitted = [], []
        while not self.delivered.empty():
            delivered.append(self.delivered.get())
        while not self.emitted.empty():
            emitted.append(self.emitted.get())
        return delivered, emitted


def generate(rid: int, prompt: str) -> Generate:
    return Generate(id=rid, params=SamplingParams(max_tokens=3), prompt=prompt)


def test_requests_are_delivered_in_arrival_order() -> None:
    h = Harness(GatedModel())
    for rid in range(1, 6):
        h.prep.submit(generate(rid, f"prompt {rid}"))
    ids = [h.delivered.get(timeout=WAIT).id for _ in range(5)]
    assert ids == [1, 2, 3, 4, 5]
    assert h.prep.pending == 0


def test_a_request_cancelled_while_waiting_is_never_tokenized() -> None:
    h = Harness(GatedModel())
    h.prep.submit(generate(1, "gate: a long prompt"))
    assert h.model.entered.wait(WAIT)  # request 1 is being tokenized
    h.prep.submit(generate(2, "never tokenized"))
    assert h.prep.pending == 2  # both count as queued
    h.prep.cancel(2)
    h.model.gate.set()
    h.settle()
    delivered, emitted = h.drain()
    assert [r.id for r in delivered] == [1]
    assert "never tokenized" not in h.model.tokenized
    assert emitted == [] and h.prep.pending == 0


def test_a_request_cancelled_while_being_prepared_is_dropped() -> None:
    h = Harness(GatedModel())
    h.prep.submit(generate(1, "gate: cancelled midway"))
    assert h.model.entered.wait(WAIT)
    h.prep.cancel(1)
    h.model.gate.set()
    h.settle()
    delivered, emitted = h.drain()
    assert delivered == [] and emitted == [] and h.prep.pending == 0


def test_a_cancel_after_the_hand_over_is_left_to_the_engine() -> None:
    h = Harness(GatedModel())
    h.prep.submit(generate(1, "quick"))
    req = h.delivered.get(timeout=WAIT)
    h.prep.cancel(1)  # too late here: the engine gets the Cancel after the request
    h.settle()
    assert req.id == 1 and h.drain() == ([], [])


def test_rejections_and_bugs_become_error_frames_and_the_thread_goes_on() -> None:
    h = Harness(GatedModel())
    h.prep.submit(generate(1, "x" * 1_000_000))  # cannot fit 4096 tokens
    h.prep.submit(generate(2, "boom"))  # the tokenizer raises
    h.prep.submit(generate(3, "fine"))
    assert h.delivered.get(timeout=WAIT).id == 3
    errors = [h.emitted.get(timeout=WAIT) for _ in range(2)]
    assert all(isinstance(e, Error) for e in errors)
    e1, e2 = errors
    assert isinstance(e1, Error) and isinstance(e2, Error)
    assert (e1.id, e1.code, e1.param) == (1, "context_length_exceeded", "prompt")
    assert (e2.id, e2.code) == (2, "internal") and "tokenizer bug" in e2.message


def test_tokenize_frames_are_answered_here() -> None:
    h = Harness(GatedModel())
    h.prep.submit(Tokenize(id=4, text="ab", add_special=False))
    result = h.emitted.get(timeout=WAIT)
    assert isinstance(result, TokenizeResult) and (result.id, result.tokens) == (4, [97, 98])


@pytest.mark.parametrize("pooling", ["none", "rank"])
def test_embeddings_with_unusable_pooling_are_refused_before_tokenizing(pooling: str) -> None:
    """Issue 8, finding 7: unpooled embeddings answered 500 "no pooled embedding"."""
    h = Harness(GatedModel(pooling=pooling), embeddings=True)
    h.prep.submit(Embed(id=5, inputs=["hello"]))
    err = h.emitted.get(timeout=WAIT)
    assert isinstance(err, Error) and (err.code, err.param) == ("unsupported", "model")
    assert h.model.tokenized == []


def test_per_token_embeddings_pass_on_the_native_route_with_their_normalisation() -> None:
    """Issue 22, item 5: llama-server's /embedding serves pooling "none"; embd_normalize
    reaches the job."""
    h = Harness(GatedModel(pooling="none"), embeddings=True)
    h.prep.submit(Embed(id=7, inputs=["ab"], native=True, normalize=-1))
    job = h.delivered.get(timeout=WAIT)
    assert isinstance(job, EmbedJob) and job.inputs == [[2, 97, 98]] and job.normalize == -1


def test_embeddings_are_tokenized_and_delivered() -> None:
    h = Harness(GatedModel(pooling="mean"), embeddings=True)
    h.prep.submit(Embed(id=6, inputs=["a", "bc"]))
    job = h.delivered.get(timeout=WAIT)
    assert isinstance(job, EmbedJob) and job.inputs == [[2, 97], [2, 98, 99]]


def test_only_the_tokenizing_thread_runs_at_a_lower_priority() -> None:
    """Tokenizing drops the GIL, so it can yield the CPU to decoding; rendering holds the
    GIL, so it must not be starved while the engine thread waits for it."""
    h = Harness(GatedModel())
    h.prep.submit(generate(1, "x"))
    h.delivered.get(timeout=WAIT)
    render, tokenize = h.prep.native_ids
    assert render is not None and tokenize is not None
    ours = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert os.getpriority(os.PRIO_PROCESS, render) == ours
    assert os.getpriority(os.PRIO_PROCESS, tokenize) == min(ours + NICE, 19)


def test_a_prompt_over_the_byte_bound_is_refused_before_the_tokenizing_thread() -> None:
    h = Harness(GatedModel())
    h.prep.submit(generate(1, "gate: holds the tokenizing thread"))
    assert h.model.entered.wait(WAIT)
    h.prep.submit(generate(2, "y" * 15_000_000))  # refused by the render stage alone
    err = h.emitted.get(timeout=WAIT)
    assert isinstance(err, Error) and err.id == 2 and err.code == "context_length_exceeded"
    h.model.gate.set()
    assert h.delivered.get(timeout=WAIT).id == 1


def test_constraints_compile_at_full_priority_and_ride_with_their_request() -> None:
    """Compiling holds the GIL (a model's first constrained request builds llguidance's view
    of the vocabulary: about 2 s of it). At nice +10 on a busy machine that froze the model's
    streams for 14 s and took the request 54 s, so it runs on the render thread."""
    compiled_on: list[int] = []
    matcher = object()

    def constrain(c: Constraint) -> Matcher:
        compiled_on.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return matcher  # type: ignore[return-value]

    h = Harness(GatedModel(), constrain=constrain)
    c = Constraint(kind="json_schema", source="{}", param="response_format")
    h.prep.submit(Generate(id=1, params=SamplingParams(max_tokens=3, constraint=c), prompt="x"))
    h.prep.submit(generate(2, "y"))
    first, second = h.delivered.get(timeout=WAIT), h.delivered.get(timeout=WAIT)
    assert isinstance(first, Request) and isinstance(second, Request)
    assert first.matcher is matcher and second.matcher is None
    assert compiled_on == [os.getpriority(os.PRIO_PROCESS, threading.get_native_id())]


def test_per_token_embeddings_too_large_to_answer_are_refused() -> None:
    """A per-token answer grows with tokens times the model's width: one request of many
    long inputs would hold gigabytes in the worker. Refused, naming `input`."""
    model = GatedModel(pooling="none")
    model.n_embd = 4096
    h = Harness(model, embeddings=True)
    h.prep.submit(Embed(id=8, inputs=["x" * 60] * 20, native=True))
    err = h.emitted.get(timeout=WAIT)
    assert isinstance(err, Error) and (err.code, err.param) == ("invalid_request", "input")
    assert "per-token embeddings" in err.message
