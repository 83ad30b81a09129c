"""The engine thread: owns the llama_context and runs continuous batching.

One long-lived thread calls every llama.cpp function that touches the context (ctypes
releases the GIL, and one thread keeps one OpenMP pool). Requests reach it already tokenized
and checked by the preparing threads (worker/preparer.py), so no text is ever tokenized here;
they and other commands arrive on a thread-safe queue and are applied between steps. Each
step's results leave as one Step frame, followed by an Occupancy frame when the counts of
busy slots or waiting requests changed.

A step:
  1. every generating request contributes its last sampled token;
  2. requests still prefilling their prompt fill the rest of the batch, in chunks, never
     past n_batch;
  3. one llama_decode over the whole batch;
  4. each request whose prompt is complete samples at its own batch index; the siblings of
     an n > 1 request that joined it sample there too (worker/siblings.py).
What goes into the batch, and what to free when the KV cache is full (purge idle caches,
then halve the batch, then preempt the newest request), are decided in worker/step_plan.py;
this module performs them. Every change to a sequence's KV cells goes through
worker/kv_cache.py, which changes the slot's books with it, and before each decode checks
that the two agree for every slot (a slot that does not is dropped, never served from).

Nothing a request carries may abort the process: the batch never exceeds n_batch, sampling
only happens where logits were requested, and sampler chains always end in dist or greedy.
"""

from __future__ import annotations

import collections
import logging
import queue
import time
from typing import Callable, Union

import llama_cpp
import msgspec

from worker.batch import BatchBuffer
from worker.constraint import ConstraintFailed, Constraints, tokenizer_for
from worker.embeddings import EmbedLine
from worker.kv_cache import KvCache
from worker.logprobs import StepLogits, token_logprob
from worker.model import LoadedModel
from worker.preparer import Preparer, Work
from worker.protocol import (
    Cancel,
    Error,
    FinishReason,
    Frame,
    Occupancy,
    SamplingParams,
    SetThreads,
    SlotState,
    Step,
    StopType,
    Timings,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from worker.request import EmbedJob, Request
from worker.sampling import SamplerChain
from worker.siblings import CopyPrefix, Join, followers_to_detach, sibling_start
from worker.slots import Slot, choose_slot, reusable_prefix
from worker.step_plan import Halve, Preempt, Purge, Remedy, make_room, plan_batch

log = logging.getLogger("worker.engine")

Emit = Callable[[Frame], None]
MAX_THREADS = 1024  # the config's bound; a frame asking for more is clamped, not obeyed


# What the engine's inbox carries: prepared work, and commands applied between steps.
Inbound = Union[Request, EmbedJob, Cancel, SetThreads]


def _pending(slot: Slot[Request]) -> int:
    """The tokens of a slot's request that its cache does not hold yet (none for a sibling
    that will share another request's prompt)."""
    assert slot.request is not None
    if slot.request.follows is not None:
        return 0
    return len(slot.request.tokens) - len(slot.cache)


class Engine:
    def __init__(self, m: LoadedModel, emit: Emit, embeddings: bool = False) -> None:
        self.m = m
        self.emit = emit
        self.inbox: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
        self.slots: list[Slot[Request]] = [Slot(seq_id=i) for i in range(m.n_seq_max)]
        self.kv = KvCache(m.memory, m.attention)
        # With a unified KV cache one sequence may use every cell; the engine enforces the
        # per-request limit itself and preempts when the shared pool runs out.
        self.n_ctx_slot = m.n_ctx
        self.waiting: collections.deque[Request] = collections.deque()
        # A Generate's id -> its requests: one, or n siblings (choice 0 first).
        self.by_id: dict[int, list[Request]] = {}
        # Prompt tokens fed to llama_decode so far (Pong): shows that n choices share one
        # evaluation of their prompt, and what prefix reuse saves.
        self.prompt_tokens_decoded = 0
        self.batch = BatchBuffer(m.n_batch)
        self._clock = 0
        # Set when a request was preempted for KV space; cleared when any request finishes.
        # Until then a preempted request waits: re-admitting it at once would only refill
        # the cache and be preempted again.
        self._kv_full = False
        self.threads = m.threads  # read by the link for Pong
        self._reported = (0, 0)  # the (active, queued) of the last Occupancy frame
        # Structured output: llguidance's tokenizer is built by the first constrained request.
        self.constraints = Constraints(lambda: tokenizer_for(m.vocab, m.n_vocab, m.is_eog), m.n_vocab)
        self.prep = Preparer(
            m, self.n_ctx_slot, embeddings, deliver=self.inbox.put, emit=emit, constrain=self.constraints.matcher
        )
        # An embedding model's jobs, a batch per loop (worker/embeddings.py).
        self.embeds = EmbedLine(m, self.batch, len(self.slots), emit) if embeddings else None

    # ---- public, thread-safe ------------------------------------------------------------------

    def submit(self, frame: Work | Cancel | SetThreads) -> None:
        """Hand a frame from the supervisor to the engine; never blocks. Requests go to the
        preparing threads first; a Cancel goes to both, which drops the request wherever it
        is."""
        if isinstance(frame, Cancel):
            if frame.index is None:  # one choice ends only once it runs, in the engine
                self.prep.cancel(frame.id)
            self.inbox.put(frame)
            if self.embeds is not None:  # after the put: the aborted engine finds the Cancel
                self.embeds.cancel_soon(frame.id)
        elif isinstance(frame, SetThreads):
            self.inbox.put(frame)
        else:
            self.prep.submit(frame)

    @property
    def active(self) -> int:
        """Slots at work: a running request's, or a sequence of the embedding batch."""
        return sum(1 for s in self.slots if not s.idle) + (self.embeds.busy if self.embeds is not None else 0)

    @property
    def kv_cells_used(self) -> int:
        """Cells the slots' caches hold. Read from the link's thread for a Pong: a sum of
        list lengths, each read whole."""
        return sum(len(s.cache) for s in self.slots)

    @property
    def queued(self) -> int:
        """Requests waiting for a slot, or still being prepared."""
        return len(self.waiting) + (len(self.embeds.jobs) if self.embeds is not None else 0) + self.prep.pending

    def slot_states(self) -> list[SlotState]:
        """What each slot is doing (GET /slots). Called from the link's thread, not this
        one: it only reads, and a reading a step old is as good as a fresh one."""
        out = []
        for s in self.slots:
            req = s.request
            state = SlotState(id=s.seq_id, n_ctx=self.n_ctx_slot, is_processing=req is not None, n_cached=len(s.cache))
            if req is not None:
                state.id_task, state.n_decoded, state.params = req.id, req.n_gen, req.params
                state.n_remain = req.max_new - req.n_gen
            out.append(state)
        return out

    # ---- the thread ---------------------------------------------------------------------------

    def run(self) -> None:
        self.prep.start()
        while True:  # the process ends it: the link exits once a Shutdown has drained
            busy = bool(self.waiting) or self.active > 0 or (self.embeds is not None and not self.embeds.idle)
            self._drain_inbox(block=not busy)
            try:
                self._admit()
                if any(not s.idle for s in self.slots):
                    self._step()
                if self.embeds is not None:  # its slots never generate, so hold no cells
                    self.embeds.step()
            except Exception as exc:  # a bug must cost requests, never the worker
                log.exception("engine step failed")
                self._fail_active("internal", f"engine error: {exc}")
            self._report_occupancy()

    def _report_occupancy(self) -> None:
        """Occupancy after every change, so that slots_busy agrees with in_flight. At most
        one small frame per step, and none while the counts hold still. A request that is
        still being prepared is noticed within the idle wait (0.5 s)."""
        counts = (self.active, self.queued)
        if counts != self._reported:
            self._reported = counts
            self.emit(Occupancy(active=counts[0], queued=counts[1]))

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                self._handle(item)
            except Exception as exc:
                log.exception("command failed")
                rid = getattr(item, "id", -1)
                self.emit(Error(id=rid, code="internal", message=str(exc)))
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, item: Inbound) -> None:
        if isinstance(item, Request):
            # Siblings queue right behind choice 0, so that they are admitted in the same
            # pass where slots allow and join its prompt evaluation.
            group = [item, *item.siblings()]
            self.by_id[item.id] = group
            self.waiting.extend(group)
        elif isinstance(item, Cancel):
            if self.embeds is not None:
                self.embeds.drop(item.id)
            for target in list(self.by_id.get(item.id, ())):
                if item.index is not None and target.index != item.index:
                    continue
                if target in self.waiting:
                    self.waiting.remove(target)
                self._finish(target, "cancelled", events=None)
        elif isinstance(item, EmbedJob):
            assert self.embeds is not None, "the preparer makes embedding jobs only for embedding models"
            self.embeds.add(item)
        elif isinstance(item, SetThreads):
            n = min(max(item.n_threads, 1), MAX_THREADS)
            self.m.set_threads(n)
            self.threads = n
            log.info("now decoding with %d threads", n)

    def _admit(self) -> None:
        """Move waiting requests into idle slots, reusing the best cached prefix."""
        while self.waiting:
            req = self.waiting[0]
            if req.preempted and self._kv_full and self.active:
                return
            slot = choose_slot(self.slots, req.tokens, self.kv.usable)
            if slot is None:
                return
            self.waiting.popleft()
            keep = self._start_in(slot, req)
            if req.sampler is None:
                req.cached = keep
                try:
                    req.sampler = SamplerChain(self._resolved(req.params), self.m.n_vocab)
                except Exception as exc:
                    log.exception("sampler chain for request %s", req.label)
                    self._error(req, "internal", f"could not build the sampler: {exc}")
                    continue
            self._clock += 1
            slot.last_used = self._clock
            slot.request = req
            req.slot = slot
            if not req.t_admitted:  # a preempted request keeps its first start
                req.t_admitted = time.perf_counter()

    def _start_in(self, slot: Slot[Request], req: Request) -> int:
        """Make `slot`'s cache ready for `req` (as sibling_start and the prefix rules say);
        returns the prompt tokens it need not decode."""
        start = None
        if req.index > 0:
            leader = self._leader(req)
            prefilling = (
                leader is not None and leader.slot is not None and leader.n_gen == 0 and req.n_gen == 0
            )
            start = sibling_start(prefilling, self.slots, slot, req.tokens, self.kv.usable)
        if isinstance(start, Join):
            # Its cells come from the leader once the prompt is decoded (_join).
            self.kv.drop(slot)
            req.follows = self._leader(req)
            return 0
        if isinstance(start, CopyPrefix):
            self.kv.copy_prefix(start.source, slot, start.n)
            return start.n
        # Never more than the KV cache still holds for that prefix (kv_rules.py).
        return self.kv.keep(slot, reusable_prefix(slot.cache, req.tokens))

    def _leader(self, req: Request) -> Request | None:
        """Choice 0 of `req`'s Generate, while it is still in the engine."""
        group = self.by_id.get(req.id, [])
        return group[0] if group and group[0].index == 0 else None

    def _resolved(self, p: SamplingParams) -> SamplingParams:
        # llama-server's convention: repeat_last_n = -1 means the whole context.
        if p.repeat_last_n == -1:
            return msgspec.structs.replace(p, repeat_last_n=self.n_ctx_slot)
        return p

    # ---- one step -----------------------------------------------------------------------------

    def _build(self, budget: int) -> list[tuple[Request, int, int, bool]]:
        """Fill the batch as plan_batch says. Returns (request, tokens fed, batch index of
        its last token, wants logits)."""
        self.batch.clear()
        plan: list[tuple[Request, int, int, bool]] = []
        for chunk in plan_batch(self.slots, _pending, min(budget, self.batch.capacity)):
            slot, req = chunk.slot, chunk.slot.request
            assert req is not None
            start = len(slot.cache)
            tokens = req.tokens[start : start + chunk.n]
            first = self.batch.add(tokens, start, slot.seq_id, "last" if chunk.complete else "none")
            plan.append((req, chunk.n, first + chunk.n - 1, chunk.complete))
        return plan

    def _step(self) -> None:
        # Whatever admission, the last step or a bug did to the KV cache, nothing is decoded
        # from cells that are not what the slots' books say.
        self.kv.check(self.slots, self._redo)
        for s in self.slots:
            f = s.request
            if f is not None and f.follows is not None:
                lead = f.follows
                if followers_to_detach(lead.slot is not None, lead.n_gen > 0):
                    f.follows = None  # it prefills the prompt itself from this step on
        budget = self.batch.capacity
        while True:
            plan = self._build(budget)
            if not plan:
                return
            rc = llama_cpp.llama_decode(self.m.ctx, self.batch.struct())
            if rc == 0:
                break
            remedy = self._make_room() if rc == 1 else None
            if remedy is None:
                self._fail_plan(plan, rc)
                return
            if isinstance(remedy, Halve):
                budget = max(1, budget // 2)
        events: list[TokenEvent] = []
        joined = {
            id(lead): [s.request for s in self.slots if s.request is not None and s.request.follows is lead]
            for lead, _, _, wants in plan
            if wants
        }
        shared = {idx for req, _, idx, wants in plan if wants and joined[id(req)]}
        logits = StepLogits(self.m.ctx, self.m.n_vocab, shared)
        for req, n_fed, last_idx, wants in plan:
            slot = req.slot
            assert slot is not None and req.sampler is not None
            start = len(slot.cache)
            self.kv.decoded(slot, req.tokens[start : start + n_fed])
            self.prompt_tokens_decoded += max(0, min(start + n_fed, len(req.prompt)) - start)
            if wants:
                followers = joined[id(req)]
                for f in followers:  # before the leader's token can end it and free its slot
                    self._join(req, f)
                for r in (req, *followers):
                    if not r.t_prompt_done:
                        r.t_prompt_done = time.perf_counter()
                    if r.max_new <= 0:
                        # llama-server's n_predict = 0: the prompt is now in the cache, and
                        # nothing is generated.
                        self._finish(r, "length", events, stop_type="limit")
                    else:
                        self._sample(r, last_idx, logits, events)
        if events:
            self.emit(Step(events=events))

    def _join(self, leader: Request, f: Request) -> None:
        """Give sibling `f` the leader's prompt cells: in a unified KV cache a copy tags the
        same cells with another sequence id, so nothing is decoded again."""
        assert f.slot is not None and leader.slot is not None
        n = len(leader.prompt)
        self.kv.copy_prefix(leader.slot, f.slot, n)
        f.cached = n
        f.follows = None

    def _sample(self, req: Request, batch_index: int, logits: StepLogits, events: list[TokenEvent]) -> None:
        """Sample `req`'s next token at `batch_index`: its bias and grammar mask edit the
        logits buffer first, and its logprobs come from that same buffer. A request that
        does none of these, at an index no other choice shares, leaves the buffer alone."""
        assert req.sampler is not None
        edits = req.logit_adjustments()
        wants_logprobs = req.logprobs is not None and req.params.logprobs is not None
        view = None
        if edits or wants_logprobs or logits.shared(batch_index):
            view = logits.fresh(batch_index)
            try:
                for a in edits:
                    a.apply(view)
            except Exception as exc:  # costs this request only, never the step
                self._constraint_failed(req, exc)
                return
        tok = req.sampler.sample(self.m.ctx, batch_index)
        lp = None
        if wants_logprobs and view is not None:
            assert req.params.logprobs is not None
            lp = token_logprob(view, tok, req.params.logprobs, self.m.piece)
        self._accept(req, tok, events, lp)

    def _make_room(self) -> Remedy[Request]:
        """After llama_decode returned 1 (no KV space): perform what make_room decides."""
        remedy = make_room(self.slots, self.batch.n, lambda s: s.request is not None and s.request.follows is not None)
        if isinstance(remedy, Purge):
            for s in remedy.slots:
                self.kv.drop(s)
        elif isinstance(remedy, Preempt):
            victim = remedy.slot
            req = victim.request
            assert req is not None
            self.kv.drop(victim)
            victim.request = None
            req.slot = None
            req.follows = None
            req.preempted = True
            self._kv_full = True
            self.waiting.appendleft(req)
            log.info("KV cache full: preempted request %s (%d tokens, resumes later)", req.label, len(req.tokens))
        return remedy

    def _fail_plan(self, plan: list[tuple[Request, int, int, bool]], rc: int) -> None:
        for req, *_ in plan:
            if rc == 1:
                # A single request filled the whole pool: that is its context limit. A decode
                # that found no room placed nothing, so its cache is as the books say.
                self._finish(req, "length", events=None, flush=True, stop_type="limit")
            else:
                # llama.cpp keeps the ubatches that succeeded before one failed: the cells no
                # longer match the books.
                if req.slot is not None:
                    self.kv.drop(req.slot)
                self._error(req, "internal", f"llama_decode failed with {rc}")

    def _redo(self, slot: Slot[Request]) -> None:
        """`slot`'s cells were dropped by the invariant check: its request, if any, decodes
        its tokens (prompt and output so far) again, as a preempted one does, and its
        output goes on where it was."""
        req = slot.request
        if req is None or req.follows is not None:
            return
        if req.kv_redone:
            # Dropped twice: something keeps breaking its cells, and a third try would only
            # loop. It ends with an error rather than an answer from a wrong cache.
            self._error(req, "internal", "the KV cache did not hold this request's tokens (logged)")
            return
        req.kv_redone = True
        req.cached = 0
        log.error("request %s decodes its %d tokens again", req.label, len(req.tokens))

    def _accept(self, req: Request, tok: int, events: list[TokenEvent], lp: TokenLogprob | None = None) -> None:
        req.n_gen += 1
        p = req.params
        if self.m.is_eog(tok) and not p.ignore_eos:
            # The end-of-generation token is no content: no text, and no logprob.
            self._finish(req, "stop", events, tokens=[tok], flush=True, stop_type="eos")
            return
        if req.matcher is not None:
            try:
                req.matcher.consume(tok)
            except ConstraintFailed as exc:
                self._constraint_failed(req, exc)
                return
        req.tokens.append(tok)
        decoded = req.decoder.decode(self.m.piece(tok))
        if lp is not None and req.logprobs is not None:
            req.logprobs.push(lp, len(decoded))
        text, matched = req.stops.feed(decoded)
        if matched:
            self._finish(req, "stop", events, text=text, tokens=[tok], stopped=True, stop_type="word")
        elif req.matcher is not None and req.matcher.stopped:
            # The grammar is complete and allows only EOS next: end here, a step sooner.
            self._finish(req, "stop", events, text=text, tokens=[tok], flush=True, stop_type="eos")
        elif req.n_gen >= req.max_new or len(req.tokens) >= self.n_ctx_slot:
            self._finish(req, "length", events, text=text, tokens=[tok], flush=True, stop_type="limit")
        else:
            lps = req.logprobs.release(len(text)) if req.logprobs is not None else []
            timings = _timings(req) if p.timings_per_token else None
            events.append(self._event(req, text=text, tokens=[tok], logprobs=lps, timings=timings))

    def _constraint_failed(self, req: Request, exc: Exception) -> None:
        """The grammar could not go on (llguidance hit a limit, or a bug): this request
        ends with an error that names its constraint's parameter; the others go on."""
        c = req.params.constraint
        if not isinstance(exc, ConstraintFailed):
            log.exception("constraint of request %s", req.label, exc_info=exc)
        self._release(req)
        self.emit(
            Error(
                id=req.id,
                code="invalid_request",
                message=f"the output could not be kept to the grammar after {req.n_gen} tokens: {exc}",
                param=c.param if c is not None else None,
            )
        )

    def _event(
        self,
        req: Request,
        text: str,
        tokens: list[int],
        logprobs: list[TokenLogprob],
        finish_reason: FinishReason | None = None,
        usage: Usage | None = None,
        stop_type: StopType | None = None,
        stopping_word: str = "",
        timings: Timings | None = None,
        id_slot: int | None = None,
    ) -> TokenEvent:
        """An event of `req`'s choice; its first carries the echoed prompt, if asked, and
        says whether the output starts inside reasoning."""
        echo, req.echo = req.echo, None
        ev = TokenEvent(
            id=req.id, text=text, tokens=tokens, finish_reason=finish_reason, usage=usage,
            index=req.index, logprobs=logprobs, echo=echo, stop_type=stop_type,
            stopping_word=stopping_word, timings=timings, id_slot=id_slot,
        )
        return self._first_marked(req, ev)

    def _finish(
        self,
        req: Request,
        reason: FinishReason,
        events: list[TokenEvent] | None,
        text: str = "",
        tokens: list[int] | None = None,
        flush: bool = False,
        stopped: bool = False,
        stop_type: StopType | None = None,
    ) -> None:
        if flush:
            # Generation ended for a reason other than a stop string: what was held back (an
            # incomplete UTF-8 tail, a possible stop-string start) is real output.
            tail, matched = req.stops.feed(req.decoder.decode(b"", final=True))
            text += tail if matched else tail + req.stops.flush()
            stopped = matched
        id_slot = req.slot.seq_id if req.slot is not None else None
        lps: list[TokenLogprob] = []
        if req.logprobs is not None:
            # A stop string's tokens are not content: only those whose text went out count.
            lps = req.logprobs.release(len(text)) if stopped else req.logprobs.release_all()
            req.logprobs.drop()
        self._release(req)
        ev = self._event(
            req,
            text=text,
            tokens=tokens or [],
            logprobs=lps,
            finish_reason=reason,
            usage=Usage(prompt_tokens=len(req.prompt), completion_tokens=req.n_gen, cached_tokens=req.cached),
            stop_type=stop_type,
            stopping_word=req.stops.matched if stop_type == "word" else "",
            timings=_timings(req),
            id_slot=id_slot,
        )
        if events is None:
            self.emit(Step(events=[ev]))
        else:
            events.append(ev)

    @staticmethod
    def _first_marked(req: Request, ev: TokenEvent) -> TokenEvent:
        """`ev`, marked as starting inside reasoning if it is the request's first event
        and its prompt ended in an open <think> block."""
        if not req.announced:
            req.announced = True
            ev.in_reasoning = req.in_reasoning
        return ev

    def _error(self, req: Request, code: str, message: str) -> None:
        # The Error ends the whole Generate for the supervisor: its other choices go too.
        for r in list(self.by_id.get(req.id, ())) or [req]:
            if r in self.waiting:
                self.waiting.remove(r)
            self._release(r)
        self.emit(Error(id=req.id, code=code, message=message))  # type: ignore[arg-type]

    def _release(self, req: Request) -> None:
        group = self.by_id.get(req.id)
        if group is not None and req in group:
            group.remove(req)
            if not group:
                del self.by_id[req.id]
        self._kv_full = False
        if req.sampler is not None:
            req.sampler.free()
            req.sampler = None
        req.matcher = None
        if req.slot is not None:
            req.slot.request = None
            req.slot = None

    def _fail_active(self, code: str, message: str) -> None:
        for s in self.slots:
            if s.request is not None:
                self._error(s.request, code, message)
            self.kv.drop(s)


def _timings(req: Request) -> Timings:
    """llama-server's timings for `req` so far: its prompt from taking a slot to its first
    sample, then generation from there to now."""
    now = time.perf_counter()
    prompt_end = req.t_prompt_done or now
    return Timings(
        prompt_n=len(req.prompt) - req.cached,
        prompt_ms=(prompt_end - req.t_admitted) * 1000.0 if req.t_admitted else 0.0,
        predicted_n=req.n_gen,
        predicted_ms=(now - req.t_prompt_done) * 1000.0 if req.t_prompt_done else 0.0,
        cache_n=req.cached,
    )
