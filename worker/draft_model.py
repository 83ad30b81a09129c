"""Speculative decoding with a draft model: a smaller model with the same vocabulary
guesses the next tokens, which the engine's step verifies as it does n-gram drafts
(worker/speculation.py).

The draft model has a context of its own, with one sequence per slot, and a book of the
tokens each sequence's cells hold. Before each step it is brought to what the slot's
request holds now: the longest common prefix of the book and the request's tokens stays,
the rest of the cells are removed and the missing tokens decoded. So whatever happened to
the slot since (a new request, a preemption, a prefix copied from a parked entry, drafts
the model rejected), the draft context follows from the tokens alone and never from the
main cache's bookkeeping. Then every drafting sequence drafts together, one batched decode
of the draft model per draft token, greedily, and stops where the draft model's own
probability for its choice falls under `p_min` (llama-server's --draft-p-min), since such
a guess is seldom accepted and costs a position in the main batch.

The draft context shares no cells between sequences (the main cache's copies do), so
the slots' tokens may not all fit in it: a step drafts for the requests that fit, those
with the least to catch up first, and the books of slots that draft nothing this step give
up their cells first.

Invariant (checked before each use, and by the tests after every step): a sequence's
cells end at position len(book) - 1 and reach down to what its next token needs (all of
them; only the last window's for a sliding-window model: worker/kv_rules.py). A sequence
found otherwise is cleared and counted in `repairs`; a decode that fails clears the whole
draft context. Either costs drafts, never output: the main model decides every token.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np

from worker.batch import BatchBuffer
from worker.kv_rules import Attention
from worker.logits import logits_at
from worker.model import LoadError, LoadedModel, model_attention
from worker.protocol import WorkerSpec
from worker.slots import common_prefix

log = logging.getLogger("worker.draft_model")


@dataclass(frozen=True)
class Want:
    """One slot's request asks for up to `limit` draft tokens after `tokens`."""

    seq: int
    tokens: Sequence[int]
    limit: int


class DraftModel:
    def __init__(
        self, model: llama_cpp.llama_model_p, ctx: llama_cpp.llama_context_p, n_vocab: int, sequences: int,
        n_batch: int, p_min: float,
    ) -> None:
        self.model, self.ctx, self.n_vocab, self.p_min = model, ctx, n_vocab, p_min
        self.attention: Attention = model_attention(model)
        self.memory = llama_cpp.llama_get_memory(ctx)
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.books: list[list[int]] = [[] for _ in range(sequences)]
        self.batch = BatchBuffer(n_batch)
        self.repairs = 0  # sequences found disagreeing with their book, and cleared
        self.decoded = 0  # tokens the draft model decoded (catching up and drafting)

    @classmethod
    def load(cls, path: str, main: LoadedModel, sequences: int, threads: int, p_min: float) -> DraftModel:
        mparams = llama_cpp.llama_model_default_params()
        mparams.use_extra_bufts = False  # as the main model: repacking crashes on AMX CPUs
        model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
        if not model:
            raise LoadError("llama.cpp could not load the draft model (draft_model)", f"could not load draft_model {path}")
        try:
            problem = vocabulary_problem(main, llama_cpp.llama_model_get_vocab(model))
            if problem:
                raise LoadError(f"draft_model: {problem}", f"draft_model {path}: {problem}")
            cparams = llama_cpp.llama_context_default_params()
            cparams.n_ctx = main.n_ctx
            cparams.n_seq_max = sequences
            cparams.n_threads = cparams.n_threads_batch = threads
            cparams.kv_unified = True
            cparams.swa_full = True  # a rejected draft's cells must be removable one by one
            cparams.n_batch = main.n_batch
            cparams.n_ubatch = min(main.n_batch, 512)
            ctx = llama_cpp.llama_init_from_model(model, cparams)
            if not ctx:
                raise LoadError("llama.cpp could not create the draft model's context", "draft context failed")
        except BaseException:
            llama_cpp.llama_model_free(model)
            raise
        return cls(model, ctx, main.n_vocab, sequences, int(llama_cpp.llama_n_batch(ctx)), p_min)

    # ---- the books --------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """Each sequence whose cells disagree with its book (the invariant above)."""
        return [problem for _, problem in self._mismatched()]

    def _span(self, seq: int) -> tuple[int, int]:
        return (
            int(llama_cpp.llama_memory_seq_pos_min(self.memory, seq)),
            int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq)),
        )

    def _mismatched(self) -> list[tuple[int, str]]:
        out = []
        for seq, book in enumerate(self.books):
            problem = self.attention.problem(len(book), *self._span(seq))
            if problem is not None:
                out.append((seq, f"draft sequence {seq}: {problem}"))
        return out

    def _clear(self, seq: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self.books[seq] = []

    def _reset(self) -> None:
        llama_cpp.llama_memory_clear(self.memory, True)
        self.books = [[] for _ in self.books]

    def _trim(self, seq: int, keep: int) -> None:
        book = self.books[seq]
        if keep >= len(book):
            return
        # A sliding-window sequence may no longer hold the window a shorter prefix needs.
        usable = self.attention.keepable(keep, len(book), self._span(seq)[0])
        if keep == 0 or not usable or not llama_cpp.llama_memory_seq_rm(self.memory, seq, keep, -1):
            self._clear(seq)
        else:
            del book[keep:]

    # ---- drafting ---------------------------------------------------------------------------

    def draft(self, wants: Sequence[Want]) -> dict[int, list[int]]:
        """Draft for each want; a sequence still catching up on a long prompt (more than
        one batch of it) drafts from a later step on."""
        for seq, problem in self._mismatched():
            log.error("%s; clearing it", problem)
            self.repairs += 1
            self._clear(seq)
        fitting = self._fitting(wants)
        # Catch up: the cells follow the request's tokens but its last, which is fed with
        # logits (as the main model's step feeds it).
        self.batch.clear()
        room = self.batch.capacity
        ready: dict[int, int] = {}  # seq -> batch index of its logits
        for w, shared in fitting:
            self._trim(w.seq, min(shared, len(w.tokens) - 1))
            book = self.books[w.seq]  # after the trim, which may have started it anew
            missing = list(w.tokens[len(book):])
            take = min(len(missing), room)
            if take <= 0:
                continue
            last = self.batch.add(missing[:take], len(book), w.seq, "last" if take == len(missing) else "none")
            room -= take
            book.extend(missing[:take])
            if take == len(missing):
                ready[w.seq] = last + take - 1
        drafts: dict[int, list[int]] = {seq: [] for seq in ready}
        limits = {w.seq: w.limit for w, _ in fitting}
        while self.batch.n:
            if not self._decode():
                return {}
            logits = {seq: self._best(i) for seq, i in ready.items()}
            self.batch.clear()
            nxt: dict[int, int] = {}
            for seq, (tok, p) in logits.items():
                if p < self.p_min:
                    continue
                drafts[seq].append(tok)
                if len(drafts[seq]) < limits[seq]:  # its logits are wanted: feed it
                    book = self.books[seq]
                    nxt[seq] = self.batch.add([tok], len(book), seq, "last")
                    book.append(tok)
            ready = nxt
        return {seq: d for seq, d in drafts.items() if d}

    def _fitting(self, wants: Sequence[Want]) -> list[tuple[Want, int]]:
        """The wants whose tokens and drafts fit in the draft context together, the least to
        catch up first, each with the tokens its book shares with it; the cells of every
        other sequence go when the rest would not fit."""
        shared = [(w, common_prefix(self.books[w.seq], w.tokens)) for w in wants if w.limit > 0 and w.tokens]
        chosen: list[tuple[Want, int]] = []
        total = 0
        for w, n in sorted(shared, key=lambda p: len(p[0].tokens) - p[1]):
            if total + len(w.tokens) + w.limit <= self.n_ctx:
                chosen.append((w, n))
                total += len(w.tokens) + w.limit
        seqs = {w.seq for w, _ in chosen}
        if total + sum(len(b) for s, b in enumerate(self.books) if s not in seqs) > self.n_ctx:
            for s in range(len(self.books)):
                if s not in seqs:
                    self._clear(s)
        return chosen

    def _decode(self) -> bool:
        rc = llama_cpp.llama_decode(self.ctx, self.batch.struct())
        if rc != 0:
            # Full, or anything else: the draft context starts over; the output never
            # depended on it.
            log.warning("draft model decode failed (%d); clearing its context", rc)
            self._reset()
            return False
        self.decoded += self.batch.n
        return True

    def _best(self, index: int) -> tuple[int, float]:
        """The draft model's greedy token at batch `index`, and its probability."""
        row = logits_at(self.ctx, index, self.n_vocab)
        tok = int(row.argmax())
        if self.p_min <= 0.0:
            return tok, 1.0  # no softmax over the vocabulary for a bound that takes all
        top = float(row[tok])
        return tok, float(1.0 / np.exp(row - top, dtype=np.float32).sum())


def for_spec(spec: WorkerSpec, main: LoadedModel) -> DraftModel | None:
    """The worker's draft model, loaded after the main one; None where it drafts without one."""
    if spec.draft_model is None or spec.spec_type == "none" or spec.embeddings:
        return None
    draft = DraftModel.load(spec.draft_model, main, main.n_slots, main.threads, spec.draft_p_min)
    log.info("draft model %s loaded (p_min %.2f)", spec.draft_model, spec.draft_p_min)
    return draft


def vocabulary_problem(main: LoadedModel, vocab: llama_cpp.llama_vocab_p) -> str | None:
    """Why a draft model's tokens cannot stand for the main model's, if they cannot: its
    drafts are token ids the main model verifies, so every id must be the same text (as
    llama-server's common_speculative_are_compatible requires, less its tolerance of
    extra tokens at the end)."""
    n = int(llama_cpp.llama_vocab_n_tokens(vocab))
    if n != main.n_vocab:
        return f"its vocabulary has {n} tokens, the model's {main.n_vocab}"
    if llama_cpp.llama_vocab_type(vocab) != llama_cpp.llama_vocab_type(main.vocab):
        return "its tokenizer is of another kind than the model's"
    for name in ("bos", "eos"):
        fn = getattr(llama_cpp, f"llama_vocab_{name}")
        if fn(vocab) != fn(main.vocab):
            return f"its {name.upper()} token differs from the model's"
    for t in range(n):
        if llama_cpp.llama_vocab_get_text(vocab, t) != llama_cpp.llama_vocab_get_text(main.vocab, t):
            return f"token {t} differs from the model's"
    return None
