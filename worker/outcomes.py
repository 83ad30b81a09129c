"""The engine's book of requests, and what becomes of each: a sampled token made output, or
the request ended (finished, failed, cancelled) and its slot given back.

Output: each token passes the end-of-generation check, the grammar, the UTF-8 decoder, the
stop strings and the limits, in that order, and becomes a TokenEvent; what the decoder or a
possible stop string held back is flushed when generation ends for another reason. An
ending releases everything the request held (its sampler, its matcher, its slot) and takes
it out of the book; the KV cells stay, for the next request's prefix. Only the engine thread
calls this; the link reads `by_id` for a Shutdown's drain.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Callable

from worker.constraint import ConstraintFailed
from worker.model import LoadedModel
from worker.priority import insert_at
from worker.protocol import Error, FinishReason, Frame, Step, StopType, Timings, TokenEvent, TokenLogprob, Usage
from worker.request import Request

log = logging.getLogger("worker.engine")


class Requests:
    def __init__(self, m: LoadedModel, n_ctx_slot: int, emit: Callable[[Frame], None]) -> None:
        self.m, self.n_ctx_slot, self.emit = m, n_ctx_slot, emit
        self.waiting: collections.deque[Request] = collections.deque()
        # A Generate's id -> its requests: one, or n siblings (choice 0 first).
        self.by_id: dict[int, list[Request]] = {}
        # Set when a request was preempted for KV space; cleared when any request ends.
        # Until then a preempted request waits: re-admitting it at once would only refill
        # the cache and be preempted again.
        self.kv_full = False

    def add(self, req: Request) -> None:
        # Siblings queue right behind choice 0, so that they are admitted in the same pass
        # where slots allow and join its prompt evaluation. By rank, then arrival
        # (worker/priority.py).
        group = [req, *req.siblings()]
        self.by_id[req.id] = group
        at = insert_at([w.rank for w in self.waiting], req.rank, front=False)
        for i, r in enumerate(group):
            self.waiting.insert(at + i, r)

    def requeue(self, req: Request) -> None:
        """`req` lost its slot (preempted, parked): back to the front of its rank."""
        self.waiting.insert(insert_at([w.rank for w in self.waiting], req.rank, front=True), req)

    def leader(self, req: Request) -> Request | None:
        """Choice 0 of `req`'s Generate, while it is still in the engine."""
        group = self.by_id.get(req.id, [])
        return group[0] if group and group[0].index == 0 else None

    def cancel(self, rid: int, index: int | None) -> None:
        """End a Generate's choices (all, or the one at `index`) wherever they are."""
        for target in list(self.by_id.get(rid, ())):
            if index is not None and target.index != index:
                continue
            if target in self.waiting:
                self.waiting.remove(target)
            self.finish(target, "cancelled", events=None)

    def accept(self, req: Request, tok: int, events: list[TokenEvent], lp: TokenLogprob | None = None) -> None:
        """`tok` was sampled for `req`: it becomes output, or ends the request."""
        req.n_gen += 1
        p = req.params
        if self.m.is_eog(tok) and not p.ignore_eos:
            # The end-of-generation token is no content: no text, and no logprob.
            self.finish(req, "stop", events, tokens=[tok], flush=True, stop_type="eos")
            return
        if req.matcher is not None:
            try:
                req.matcher.consume(tok)
            except ConstraintFailed as exc:
                self.constraint_failed(req, exc)
                return
        req.tokens.append(tok)
        decoded = req.decoder.decode(self.m.piece(tok))
        if lp is not None and req.logprobs is not None:
            req.logprobs.push(lp, len(decoded))
        text, matched = req.stops.feed(decoded)
        if matched:
            self.finish(req, "stop", events, text=text, tokens=[tok], stopped=True, stop_type="word")
        elif req.matcher is not None and req.matcher.stopped:
            # The grammar is complete and allows only EOS next: end here, a step sooner.
            self.finish(req, "stop", events, text=text, tokens=[tok], flush=True, stop_type="eos")
        elif req.n_gen >= req.max_new or len(req.tokens) >= self.n_ctx_slot:
            self.finish(req, "length", events, text=text, tokens=[tok], flush=True, stop_type="limit")
        else:
            lps = req.logprobs.release(len(text)) if req.logprobs is not None else []
            timings = timings_of(req) if p.timings_per_token else None
            events.append(self._event(req, text=text, tokens=[tok], logprobs=lps, timings=timings))

    def constraint_failed(self, req: Request, exc: Exception) -> None:
        """The grammar could not go on (llguidance hit a limit, or a bug): this request
        ends with an error that names its constraint's parameter; the others go on."""
        c = req.params.constraint
        if not isinstance(exc, ConstraintFailed):
            log.exception("constraint of request %s", req.label, exc_info=exc)
        self.release(req)
        self.emit(
            Error(
                id=req.id,
                code="invalid_request",
                message=f"the output could not be kept to the grammar after {req.n_gen} tokens: {exc}",
                param=c.param if c is not None else None,
            )
        )

    def finish(
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
        """End `req` with its last event: appended to `events` (this step's), or emitted
        alone when no step is being built."""
        if flush:
            # Generation ended for a reason other than a stop string: what was held back (an
            # incomplete UTF-8 tail, a possible stop-string start) is real output.
            tail, matched = req.stops.feed(req.decoder.decode(b"", final=True))
            text += tail if matched else tail + req.stops.flush()
            stopped = matched
        id_slot = req.slot.id if req.slot is not None else None
        lps: list[TokenLogprob] = []
        if req.logprobs is not None:
            # A stop string's tokens are not content: only those whose text went out count.
            lps = req.logprobs.release(len(text)) if stopped else req.logprobs.release_all()
            req.logprobs.drop()
        self.release(req)
        ev = self._event(
            req,
            text=text,
            tokens=tokens or [],
            logprobs=lps,
            finish_reason=reason,
            usage=Usage(prompt_tokens=len(req.prompt), completion_tokens=req.n_gen, cached_tokens=req.cached),
            stop_type=stop_type,
            stopping_word=req.stops.matched if stop_type == "word" else "",
            timings=timings_of(req),
            id_slot=id_slot,
        )
        if events is None:
            self.emit(Step(events=[ev]))
        else:
            events.append(ev)

    def error(self, req: Request, code: str, message: str) -> None:
        # The Error ends the whole Generate for the supervisor: its other choices go too.
        for r in list(self.by_id.get(req.id, ())) or [req]:
            if r in self.waiting:
                self.waiting.remove(r)
            self.release(r)
        self.emit(Error(id=req.id, code=code, message=message))  # type: ignore[arg-type]

    def release(self, req: Request) -> None:
        group = self.by_id.get(req.id)
        if group is not None and req in group:
            group.remove(req)
            if not group:
                del self.by_id[req.id]
        self.kv_full = False
        if req.sampler is not None:
            req.sampler.free()
            req.sampler = None
        req.matcher = None
        if req.slot is not None:
            req.slot.request = None
            req.slot = None

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
        says whether the output starts inside reasoning (its prompt ended in an open
        <think> block)."""
        echo, req.echo = req.echo, None
        ev = TokenEvent(
            id=req.id, text=text, tokens=tokens, finish_reason=finish_reason, usage=usage,
            index=req.index, logprobs=logprobs, echo=echo, stop_type=stop_type,
            stopping_word=stopping_word, timings=timings, id_slot=id_slot,
        )
        if not req.announced:
            req.announced = True
            ev.in_reasoning = req.in_reasoning
            ev.prompt_usage = Usage(prompt_tokens=len(req.prompt), completion_tokens=0, cached_tokens=req.cached)
        return ev


def timings_of(req: Request) -> Timings:
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
