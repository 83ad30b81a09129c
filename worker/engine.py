"""The engine thread: owns the llama_context and runs continuous batching.

One long-lived thread calls every llama.cpp function that touches the context (ctypes
releases the GIL, and one thread keeps one OpenMP pool). Requests reach it already tokenized
and checked by the preparing threads (worker/preparer.py), so no text is ever tokenized here;
they and other commands arrive on a thread-safe queue and are applied between steps. Each
step's results leave as one Step frame, followed by an Occupancy frame when the counts of
busy slots or waiting requests changed.

A step serves the running requests of one LoRA set, in turns (worker/adapters.py):
  1. every generating request contributes its last sampled token;
  2. prompts still prefilling fill the rest of the batch, in chunks, never past n_batch;
  3. one llama_decode over the whole batch;
  4. each request whose prompt is complete samples at its own batch index, with the n > 1
     siblings that joined it (worker/siblings.py).
Before a step, waiting requests take idle slots (worker/admission.py), a better class
taking one back from a worse where none is idle (worker/priority.py); each sampled token
becomes output, or ends its request, in worker/outcomes.py. What goes into the batch, and
what to free when the KV cache is full (idle caches, then half the batch, then the newest
request), are decided in worker/step_plan.py; this module performs them. Every change to a
sequence's KV cells goes through worker/kv_cache.py, which checks before each decode that
cells and books agree for every slot (a slot that does not is dropped, never served from).
A lone stream's steps run back to back without the loop's rounds (worker/run_ahead.py).

Nothing a request carries may abort the process: the batch never exceeds n_batch, sampling
only happens where logits were requested, and sampler chains always end in dist or greedy.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING, Callable, Sequence

import llama_cpp

from worker.adapters import Adapters
from worker.admission import Admission
from worker.batch import BatchBuffer
from worker.constraint import Constraints, tokenizer_for
from worker.embeddings import EmbedLine
from worker.event_hold import EventHold
from worker.inbox import Inbound, Persist, Wake
from worker.kv_cache import KvCache
from worker.kv_entries import Entries
from worker.kv_room import KvRoom
from worker.logprobs import StepLogits, token_logprob
from worker.media.encoder import Encoder
from worker.media.steps import ImageSteps
from worker.model import LoadedModel
from worker.outcomes import Requests
from worker.preparer import Preparer, Work
from worker.priority import in_step
from worker.prompt_cache import CacheOptions, PromptCache
from worker.protocol import (
    Cancel, Error, Frame, Generate, Occupancy, SetCacheBudget, SetThreads, SlotFile, Step, TokenEvent,
)
from worker.request import EmbedJob, Request, pending_tokens
from worker.run_ahead import RunAhead, lone_request
from worker.siblings import followers_by_lead, followers_to_detach
from worker.slot_files import SlotFiles
from worker.speculation import Speculation
from worker.slots import Slot
from worker.step_plan import Halve, plan_batch

if TYPE_CHECKING:
    from llguidance import LLTokenizer

    from worker.draft_model import DraftModel
    from worker.media.projector import Projector

log = logging.getLogger("worker.engine")

Emit = Callable[[Frame], None]
MAX_THREADS = 1024  # the config's bound; a frame asking for more is clamped, not obeyed


# One request's share of a step: (request, tokens fed, batch index of its last one, wants
# logits, draft tokens fed after them).
Fed = tuple[Request, int, int, bool, list[int]]

class Engine:
    def __init__(
        self,
        m: LoadedModel,
        emit: Emit,
        embeddings: bool = False,
        n_ctx_slot: int | None = None,
        cache: CacheOptions | None = None,
        vocabulary: LLTokenizer | None = None,
        draft_max: int = 0,
        draft_model: DraftModel | None = None,
        projector: Projector | None = None,
    ) -> None:
        self.m = m
        self.hold = EventHold(emit)  # holds a whole answer's events for its end
        self.emit = emit = self.hold
        self.inbox: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
        self.slots: list[Slot[Request]] = [Slot(seq_id=i, id=i) for i in range(m.n_slots)]
        self.kv = KvCache(m.memory, m.attention)
        # The sequences beyond the slots': finished prompts kept for later ones.
        self.entries: Entries[Request] = Entries(self.kv, m.n_slots, m.n_seq_max)
        # Saved prompts beyond the KV cache: host memory, and disk across runs.
        self.cache = PromptCache(m.ctx, self.kv, self.entries, cache or CacheOptions(ram_bytes=0))
        self.entries.on_evict = lambda e: self.cache.spill(e, e.last_used)
        # With a unified KV cache one sequence may use every cell; the engine enforces the
        # per-request limit itself (`n_ctx_slot`, else all of it) and preempts when the
        # shared pool runs out.
        self.n_ctx_slot = min(m.n_ctx, n_ctx_slot or m.n_ctx)
        # Who waits, who runs, and how each ends (worker/outcomes.py).
        self.requests = Requests(m, self.n_ctx_slot, emit)
        self.room = KvRoom(self.slots, self.kv, self.entries, self.cache, self.requests)
        # LoRA adapters: each step serves one set, in turns (worker/adapters.py).
        self.adapters = Adapters(m.ctx, m.adapters, self.kv, m.options.lora_turn_steps)
        # Speculative decoding, by n-gram lookup or a draft model (worker/speculation.py).
        self.spec = Speculation(self.kv, 0 if embeddings else draft_max, self.n_ctx_slot, draft_model)
        self.admission = Admission(
            self.slots, self.kv, self.entries, self.requests, m.n_vocab, self.n_ctx_slot, lambda: self.active,
            self.cache,
        )
        # Prompt tokens fed to llama_decode so far (Pong): what sharing and prefix reuse save.
        self.prompt_tokens_decoded = 0
        self.batch = BatchBuffer(m.n_batch)
        self.threads = m.threads  # read by the link for Pong
        self._reported = (0, 0)  # the (active, queued) of the last Occupancy frame
        # Structured output: llguidance's view of the vocabulary, built while the model
        # loaded (worker/link.py), else by the first constrained request.
        self.constraints = Constraints((lambda: vocabulary) if vocabulary is not None else (
            lambda: tokenizer_for(m.vocab, m.n_vocab, m.is_eog)), m.n_vocab)
        self.prep = Preparer(m, self.n_ctx_slot, embeddings, deliver=self.inbox.put, emit=emit,
                             constrain=self.constraints.matcher, projector=projector, n_adapters=len(m.adapters))
        # Images: encoded on a thread of their own, decoded into each request's sequence by
        # the image step (worker/media/steps.py).
        self.images = None if projector is None else ImageSteps(
            m.ctx, Encoder(projector, lambda: self.inbox.put(Wake()), n_ctx_slot=self.n_ctx_slot, options=m.options), self.kv, self.room, self.requests,
            self.adapters.apply,
        )
        # An embedding model's jobs, a batch per loop (worker/embeddings.py).
        self.embeds = EmbedLine(m, self.batch, len(self.slots), emit) if embeddings else None
        # llama-server's slot save, restore and erase, each once its slot is idle.
        self.slot_files = SlotFiles(m, self.kv, self.entries, self.slots, self.n_ctx_slot, emit, projector is not None)
        # A lone stream's steps, back to back while nothing else needs the loop.
        self.ahead = RunAhead(m.ctx, self.batch, self.kv, self.requests, self.spec, self.inbox.empty, self.hold, self.adapters.apply)

    # ---- public, thread-safe ------------------------------------------------------------------

    def submit(self, frame: Work | Cancel | SetThreads | SetCacheBudget | SlotFile) -> None:
        """Hand a frame from the supervisor to the engine; never blocks. Requests go to the
        preparing threads first; a Cancel goes to both, which drops the request wherever it
        is."""
        if isinstance(frame, Cancel):
            if frame.index is None:  # one choice ends only once it runs, in the engine
                self.prep.cancel(frame.id)
                self.hold.drop(frame.id)
            self.inbox.put(frame)
            if self.embeds is not None:  # after the put: the aborted engine finds the Cancel
                self.embeds.cancel_soon(frame.id)
        elif isinstance(frame, (SetThreads, SetCacheBudget, SlotFile)):
            self.inbox.put(frame)
        else:
            if isinstance(frame, Generate) and frame.hold_events:
                self.hold.hold(frame.id, frame.n)
            self.prep.submit(frame)

    @property
    def active(self) -> int:
        """Slots at work: a running request's, or a sequence of the embedding batch."""
        return sum(s.request is not None for s in self.slots) + (self.embeds.busy if self.embeds is not None else 0)

    @property
    def kv_cells_used(self) -> int:
        """Cells the slots' caches hold. Read from the link's thread for a Pong: a sum of
        list lengths, each read whole."""
        return sum(len(s.cache) for s in self.slots)

    @property
    def queued(self) -> int:
        """Requests waiting for a slot, or still being prepared."""
        return len(self.requests.waiting) + (len(self.embeds.jobs) if self.embeds is not None else 0) + self.prep.pending

    # ---- the thread ---------------------------------------------------------------------------

    def persist(self, timeout: float) -> bool:
        """Have the engine thread write the hottest prompts to disk, and wait for it (a
        clean stop, after the last request)."""
        p = Persist()
        self.inbox.put(p)
        return p.done.wait(timeout)

    def run(self) -> None:
        if self.embeds is None:
            try:
                self.admission.clock = self.cache.load()
            except Exception:  # a bad cache folder costs its prompts, never the worker
                log.exception("reading the saved prompts failed")
        self.prep.start()
        while True:  # the process ends it: the link exits once a Shutdown has drained
            # Only this thread changes what `active` counts, so the last report's is current.
            busy = bool(self.requests.waiting) or self._reported[0] > 0 or (self.embeds is not None and not self.embeds.idle)
            # Requests that all wait for their images' encoding: sleep until a Wake.
            stalled = self.images is not None and self.images.stalled(self.slots)
            self._drain_inbox(block=not busy or stalled)
            try:
                if self.slot_files.pending:  # before a request may take the slot
                    self.slot_files.step()
                if self.requests.waiting:
                    self.room.make_way(self.admission.clock)
                    self.admission.admit()
                if any(s.request is not None for s in self.slots):
                    self._step()
                    lone = lone_request(self.slots, bool(self.requests.waiting), self.spec.model is not None)
                    if lone is not None:
                        self.cache.step(self.slots, self.ahead.run(lone, self.room.dropped))
                if self.embeds is not None:  # its slots never generate, so hold no cells
                    self.embeds.step()
            except Exception as exc:  # a bug must cost requests, never the worker
                log.exception("engine step failed")
                self._fail_active("internal", f"engine error: {exc}")
            self._report_occupancy()

    def _report_occupancy(self) -> None:
        """Occupancy after every change (slots_busy agrees with in_flight): at most a small
        frame a step, none while the counts hold still (a request being prepared: 0.5 s)."""
        counts = (self.active, self.queued)
        if counts != self._reported:
            self._reported = counts
            self.emit(Occupancy(active=counts[0], queued=counts[1]))

    def _drain_inbox(self, block: bool) -> None:
        if not block and self.inbox.empty():  # most steps: no exception raised and caught
            return
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
            self.requests.add(item)
        elif isinstance(item, Cancel):
            if self.embeds is not None:
                self.embeds.drop(item.id)
            self.requests.cancel(item.id, item.index)
        elif isinstance(item, EmbedJob):
            assert self.embeds is not None, "the preparer makes embedding jobs only for embedding models"
            self.embeds.add(item)
        elif isinstance(item, SlotFile):
            if self.embeds is not None:
                self.emit(Error(id=item.id, code="unsupported", message="an embedding model's slots hold no cache", param="model"))
            else:
                self.slot_files.add(item)
        elif isinstance(item, Persist):
            try:
                if self.embeds is None:
                    self.cache.persist(self.slots, self.admission.clock)
            except Exception:  # a full disk or a folder gone costs the saved prompts only
                log.exception("writing the saved prompts failed")
            finally:
                item.done.set()
        elif isinstance(item, Wake):
            pass  # the loop looks again
        elif isinstance(item, SetCacheBudget):
            self.cache.set_ram_bytes(max(0, item.n_bytes))
        elif isinstance(item, SetThreads):
            n = min(max(item.n_threads, 1), MAX_THREADS)
            self.m.set_threads(n)
            self.threads = n
            log.info("now decoding with %d threads", n)

    # ---- one step -----------------------------------------------------------------------------

    def _build(self, slots: Sequence[Slot[Request]], budget: int, drafting: bool) -> list[Fed]:
        """Fill the batch as plan_batch says; then, with `drafting`, give generating requests
        the room left for n-gram drafts (speculative decoding), verified in this same step.
        Returns (request, tokens fed, batch index of its last token, wants logits, draft)."""
        self.batch.clear()
        budget = min(budget, self.batch.capacity)
        chunks = plan_batch(slots, pending_tokens, budget)
        room = budget - sum(c.n for c in chunks) if drafting else 0
        plan: list[Fed] = []
        for chunk in chunks:
            slot, req = chunk.slot, chunk.slot.request
            assert req is not None
            start = len(slot.cache)
            tokens = req.tokens[start : start + chunk.n]
            # Complete: the chunk reaches the prompt's end (not only the next image's start).
            complete = chunk.complete and start + chunk.n == len(req.tokens)
            draft = self.spec.draft(req, room) if chunk.n == 1 and complete and req.n_gen > 0 else []  # not prefilling
            room -= len(draft)
            logits = "all" if draft else "last" if complete else "none"
            first = self.batch.add(tokens + draft, self.kv.position(slot.cache, start), slot.seq_id, logits)
            plan.append((req, chunk.n, first + chunk.n - 1, complete, draft))
        return plan

    def _step(self) -> None:
        # Whatever admission, the last step or a bug did to the KV cache, nothing is decoded
        # from cells that are not what the slots' books say.
        self.kv.check([*self.slots, *self.entries.checked()], self.room.dropped)
        for s in self.slots:
            f = s.request
            if f is not None and f.follows is not None:
                lead = f.follows
                if followers_to_detach(lead.slot is not None, lead.n_gen > 0):
                    f.follows = None  # it prefills the prompt itself from this step on
            if f is not None and f.awaits is not None:
                self.admission.copy_awaited(f)
        if self.images is not None:
            self.images.step(self.slots)
        budget, drafting = self.batch.capacity, True
        self.spec.prepare(self.slots)
        # One class's prompt keeps worse classes out (worker/priority.py), one adapter set
        # the others (worker/adapter_turns.py).
        slots = self.adapters.turn(in_step(self.slots, pending_tokens), pending_tokens, lambda r: r.adapters)
        while True:
            plan = self._build(slots, budget, drafting)
            if not plan:
                return
            rc = llama_cpp.llama_decode(self.m.ctx, self.batch.struct())
            if rc == 0:
                break
            if rc == 1 and drafting and any(fed[4] for fed in plan):
                drafting = False  # drafts are the first thing to give up for KV room
                continue
            remedy = self.room.make_room(self.batch.n) if rc == 1 else None
            if remedy is None:
                self.room.fail_plan([req for req, *_ in plan], rc)
                return
            if isinstance(remedy, Halve):
                budget = max(1, budget // 2)
        events: list[TokenEvent] = []
        joined = followers_by_lead((s.request for s in self.slots if s.request is not None), lambda r: r.follows)
        shared = {idx for req, _, idx, wants, _ in plan if wants and id(req) in joined} if joined else set()
        logits = StepLogits(self.m.ctx, self.m.n_vocab, shared)
        for req, n_fed, last_idx, wants, draft in plan:
            slot = req.slot
            assert slot is not None and req.sampler is not None
            start = len(slot.cache)
            self.kv.decoded(slot, req.tokens[start : start + n_fed] + draft)
            self.prompt_tokens_decoded += max(0, min(start + n_fed, len(req.prompt)) - start)
            if draft:
                self.spec.verify(req, slot, start, last_idx, draft, lambda r, i: self._sample(r, i, logits, events))
            elif wants:
                followers = joined.get(id(req), [])
                for f in followers:  # before the leader's token can end it and free its slot
                    self.admission.join(req, f)
                for r in (req, *followers):
                    if not r.t_prompt_done:
                        r.t_prompt_done = time.perf_counter()
                    if r.max_new <= 0:
                        # llama-server's n_predict = 0: the prompt is now in the cache, and
                        # nothing is generated.
                        self.requests.finish(r, "length", events, stop_type="limit")
                    else:
                        self._sample(r, last_idx, logits, events)
        if events:
            self.emit(Step(events=events))
        self.cache.step(self.slots)  # after the step's tokens went out: it may save an idle entry

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
                self.requests.constraint_failed(req, exc)
                return
        tok = req.sampler.sample(self.m.ctx, batch_index)
        lp = None
        if wants_logprobs and view is not None:
            assert req.params.logprobs is not None
            lp = token_logprob(view, tok, req.params.logprobs, self.m.piece)
        self.requests.accept(req, tok, events, lp)

    def _fail_active(self, code: str, message: str) -> None:
        for s in self.slots:
            if s.request is not None:
                self.requests.error(s.request, code, message)
            self.kv.drop(s)

