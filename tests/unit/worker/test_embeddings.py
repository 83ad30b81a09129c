"""worker/embeddings.py without a model: llama.cpp's three calls are replaced by a recorder,
so the packing (n_batch tokens, n_seq sequences), one decode per step, the normalisation and
the KV clears are checked exactly. The e2e tests check the same path against the demo model's real vectors."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import llama_cpp
import numpy as np
import pytest

from worker.batch import BatchBuffer
from worker.embeddings import EmbedLine, EmbedRun, normalized
from worker.protocol import EmbedResult, Error
from worker.request import EmbedJob

N_EMBD = 3


@dataclass
class FakeLlama:
    """Records every call; a sequence's pooled vector is given by `vector(tokens)`."""

    batch: BatchBuffer
    calls: list[Any] = field(default_factory=list)
    rc: int = 0
    pooled: bool = True
    _seqs: dict[int, list[int]] = field(default_factory=dict)
    _keep: list[Any] = field(default_factory=list)  # the pointers' arrays stay alive

    def llama_memory_clear(self, memory: object, data: bool) -> None:
        self.calls.append("clear")

    def llama_decode(self, ctx: object, batch: object) -> int:
        n = self.batch.n
        seqs: dict[int, list[int]] = {}
        for tok, seq, pos, logits in zip(
            self.batch.token[:n], self.batch.seq[:n], self.batch.pos[:n], self.batch.logits[:n]
        ):
            assert logits == 1  # pooling reads every token's output
            assert pos == len(seqs.get(int(seq), []))  # each input from position 0
            seqs.setdefault(int(seq), []).append(int(tok))
        self._seqs = seqs
        self.calls.append(("decode", list(seqs.values())))
        return self.rc

    def llama_get_embeddings_seq(self, ctx: object, seq: int) -> Any:
        if not self.pooled:
            return None
        tokens = self._seqs[seq]
        arr = (ctypes.c_float * N_EMBD)(*vector(tokens))
        self._keep.append(arr)
        return ctypes.cast(arr, ctypes.POINTER(ctypes.c_float))

    def llama_get_embeddings_ith(self, ctx: object, i: int) -> Any:
        """Batch position `i`'s own vector (pooling none): its token, position and sequence."""
        tok, pos, seq = int(self.batch.token[i]), int(self.batch.pos[i]), int(self.batch.seq[i])
        arr = (ctypes.c_float * N_EMBD)(float(tok), float(pos), float(seq))
        self._keep.append(arr)
        return ctypes.cast(arr, ctypes.POINTER(ctypes.c_float))


def vector(tokens: list[int]) -> list[float]:
    # Token 0 stands for a zero vector; otherwise a 3-4-0 triangle scaled by the first token.
    return [0.0, 0.0, 0.0] if tokens[0] == 0 else [3.0 * tokens[0], 4.0 * tokens[0], 0.0]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> Any:
    def go(
        inputs: list[list[int]], n_batch: int = 8, n_seq: int = 4, pooling: str = "mean", normalize: int = 2,
        **fake: Any,
    ) -> tuple[EmbedResult | Error, FakeLlama]:
        batch = BatchBuffer(n_batch)
        llama = FakeLlama(batch, **fake)
        for name in ("llama_memory_clear", "llama_decode", "llama_get_embeddings_seq", "llama_get_embeddings_ith"):
            monkeypatch.setattr(llama_cpp, name, getattr(llama, name))
        model: Any = SimpleNamespace(memory=object(), ctx=object(), n_embd=N_EMBD, pooling=pooling)
        job = EmbedRun(model, batch, n_seq, EmbedJob(id=7, inputs=inputs, normalize=normalize))
        while (answer := job.step()) is None:
            assert llama.calls[-1][0] == "decode"  # a step is one decode, then the inbox
        return answer, llama

    return go


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Any:
    def go(
        inputs: list[list[int]], n_batch: int = 8, n_seq: int = 4, pooling: str = "mean"
    ) -> tuple[EmbedRun, FakeLlama]:
        batch = BatchBuffer(n_batch)
        llama = FakeLlama(batch)
        for name in ("llama_memory_clear", "llama_decode", "llama_get_embeddings_seq"):
            monkeypatch.setattr(llama_cpp, name, getattr(llama, name))
        model: Any = SimpleNamespace(memory=object(), ctx=object(), n_embd=N_EMBD, pooling=pooling)
        return EmbedRun(model, batch, n_seq, EmbedJob(id=7, inputs=inputs)), llama

    return go


def test_inputs_are_packed_up_to_n_batch_tokens(run: Any) -> None:
    inputs = [[1, 1, 1], [2, 2, 2], [3], [4, 4, 4]]
    answer, llama = run(inputs, n_batch=8, n_seq=4)
    assert llama.calls == [
        "clear", ("decode", [[1, 1, 1], [2, 2, 2], [3]]),  # 7 tokens; the next 3 do not fit
        "clear", ("decode", [[4, 4, 4]]),
        "clear",  # the KV cache is left empty
    ]
    assert isinstance(answer, EmbedResult) and answer.id == 7
    assert answer.prompt_tokens == 10


def test_inputs_are_packed_up_to_the_sequence_count(run: Any) -> None:
    _, llama = run([[1], [2], [3], [4], [5]], n_batch=8, n_seq=2)
    decodes = [c[1] for c in llama.calls if c != "clear"]
    assert decodes == [[[1], [2]], [[3], [4]], [[5]]]


def test_vectors_are_unit_length_in_input_order_and_zero_stays_zero(run: Any) -> None:
    answer, _ = run([[2, 9], [0], [1]], n_batch=2, n_seq=4)
    assert isinstance(answer, EmbedResult)
    unit = pytest.approx([0.6, 0.8, 0.0])
    assert answer.data == [unit, [0.0, 0.0, 0.0], unit]


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (-1, [3.0, -4.0, 0.0]),  # as it is
        (0, [3.0 * 32760 / 4, -32760.0, 0.0]),  # the largest magnitude to int16's range
        (1, [3 / 7, -4 / 7, 0.0]),  # taxicab
        (2, [0.6, -0.8, 0.0]),  # Euclidean, the default
        (3, [3 / 91 ** (1 / 3), -4 / 91 ** (1 / 3), 0.0]),  # p-norm
    ],
)
def test_normalisation_is_llama_cpps_embd_normalize(p: int, expected: list[float]) -> None:
    """Issue 22: llama-server's embd_normalize (common/common.cpp common_embd_normalize)."""
    assert normalized(np.array([3.0, -4.0, 0.0]), p).tolist() == pytest.approx(expected)
    assert normalized(np.zeros(3), p).tolist() == [0.0, 0.0, 0.0]


def test_pooled_vectors_take_the_jobs_normalisation(run: Any) -> None:
    answer, _ = run([[1]], normalize=-1)
    assert isinstance(answer, EmbedResult) and answer.data == [[3.0, 4.0, 0.0]]


def test_pooling_none_gives_each_inputs_tokens_their_own_vectors_unnormalised(run: Any) -> None:
    """Issue 22, item 5: llama-server's native /embedding with pooling "none" answers a vector
    per token, in token order, not normalised (test_embedding.py test_embedding_pooling_none).
    The second group's inputs restart at sequence 0: each vector is read from its own
    batch position, not from the first group's."""
    answer, llama = run([[5, 6], [7], [8, 9]], n_batch=3, pooling="none", normalize=2)
    assert isinstance(answer, EmbedResult) and answer.data == [] and answer.prompt_tokens == 5
    assert answer.per_token == [
        [[5.0, 0.0, 0.0], [6.0, 1.0, 0.0]],
        [[7.0, 0.0, 1.0]],
        [[8.0, 0.0, 0.0], [9.0, 1.0, 0.0]],
    ]
    assert [c for c in llama.calls if c != "clear"] == [("decode", [[5, 6], [7]]), ("decode", [[8, 9]])]


def test_a_failed_decode_is_an_internal_error_and_stops_the_job(run: Any) -> None:
    answer, llama = run([[1], [2]], n_seq=1, rc=1)
    assert answer == Error(id=7, code="internal", message="llama_decode failed with 1")
    assert llama.calls == ["clear", ("decode", [[1]])]


def test_a_missing_pooled_vector_is_an_internal_error(run: Any) -> None:
    answer, _ = run([[1]], pooled=False)
    assert answer == Error(id=7, code="internal", message="no pooled embedding")


def test_each_step_decodes_one_batch_and_tells_how_many_sequences_it_used(started: Any) -> None:
    job, llama = started([[1, 1, 1], [2, 2, 2], [3, 3, 3]], n_batch=6, n_seq=4)
    assert job.step() is None
    assert llama.calls == ["clear", ("decode", [[1, 1, 1], [2, 2, 2]])] and job.busy == 2
    answer = job.step()
    assert isinstance(answer, EmbedResult) and len(answer.data) == 3 and job.busy == 1
    assert llama.calls[2:] == ["clear", ("decode", [[3, 3, 3]]), "clear"]


def test_an_abandoned_job_decodes_nothing_more_and_leaves_the_cache_empty(started: Any) -> None:
    """A client that left: the engine abandons its job between two batches (issue 20)."""
    job, llama = started([[1] * 5, [2] * 5, [3] * 5], n_batch=5, n_seq=4)
    assert job.step() is None
    job.abandon()
    assert llama.calls == ["clear", ("decode", [[1] * 5]), "clear"]


def test_a_cancel_from_the_link_aborts_the_decode_under_way_and_nothing_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The abort callback that EmbedLine installs answers True once the running job is
    cancelled, so llama_decode stops halfway (rc 2) rather than at the end of a batch that
    may take over a second (issue 20)."""
    batch = BatchBuffer(4)
    llama = FakeLlama(batch)
    installed: list[Any] = []
    monkeypatch.setattr(llama_cpp, "llama_set_abort_callback", lambda ctx, cb, data: installed.append(cb))
    for name in ("llama_memory_clear", "llama_get_embeddings_seq"):
        monkeypatch.setattr(llama_cpp, name, getattr(llama, name))
    sent: list[Any] = []
    pooling = "mean"
    model: Any = SimpleNamespace(memory=object(), ctx=object(), n_embd=N_EMBD, pooling=pooling)
    line = EmbedLine(model, batch, 4, sent.append)
    (abort,) = installed

    def decode(ctx: object, b: object) -> int:
        llama.llama_decode(ctx, b)
        assert abort(None) is False  # ggml asks after a node: go on
        line.cancel_soon(7)  # meanwhile, on the link's thread
        line.cancel_soon(8)  # another id changes nothing
        return 2 if abort(None) else 0  # ggml asks again, and stops

    monkeypatch.setattr(llama_cpp, "llama_decode", decode)
    line.add(EmbedJob(id=7, inputs=[[1, 1, 1], [2, 2, 2]]))
    assert line.step() is True and not line.idle and sent == []
    assert line.step() is True and llama.calls.count(("decode", [[2, 2, 2]])) == 0  # no second decode
    line.drop(7)  # the engine reads the Cancel
    assert line.idle and sent == [] and llama.calls[-1] == "clear"
    assert line.step() is False


def test_a_job_waiting_behind_another_is_dropped_without_a_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = BatchBuffer(8)
    llama = FakeLlama(batch)
    monkeypatch.setattr(llama_cpp, "llama_set_abort_callback", lambda ctx, cb, data: None)
    for name in ("llama_memory_clear", "llama_decode", "llama_get_embeddings_seq"):
        monkeypatch.setattr(llama_cpp, name, getattr(llama, name))
    sent: list[Any] = []
    pooling = "mean"
    model: Any = SimpleNamespace(memory=object(), ctx=object(), n_embd=N_EMBD, pooling=pooling)
    line = EmbedLine(model, batch, 4, sent.append)
    line.add(EmbedJob(id=1, inputs=[[1]]))
    line.add(EmbedJob(id=2, inputs=[[2]]))
    line.drop(2)
    while line.step():
        pass
    assert [a.id for a in sent] == [1] and ("decode", [[2]]) not in llama.calls
