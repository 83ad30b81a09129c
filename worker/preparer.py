"""Preparing requests off the step loop: the engine thread never renders or tokenizes.

Generate, Embed, Tokenize, Detokenize and Render frames come here first, and pass two threads in turn
(worker/prompts.py says what each stage does):

- **render** (normal priority) renders the chat template and refuses a text that is
  certainly too long from its byte length. A request with a constraint (structured output)
  has it compiled here (worker/constraint.py): a GBNF grammar converted to Lark, which is
  Python, then compiled by llguidance, which builds its view of the vocabulary on a
  model's first constrained request (seconds, most of it holding the GIL). A grammar that
  does not compile is thus a 400 before the request can take a slot, and compiling never
  runs on the step loop. All of this holds the GIL. A thread that holds the GIL must not be
  starved of CPU, or the engine thread would wait on it: a priority inversion that, at low
  priority, froze a stream for 13 steps on a 15 MB prompt, and for 14 s while the
  vocabulary was built at nice +10 with both cores busy (the constrained request took 54 s).
- **tokenize** (nice +`NICE`) runs llama.cpp's tokenizer, which drops the GIL, and checks
  exact counts. On a machine whose cores the decode threads fill, tokenizing a long prompt
  then takes only the time that decoding leaves over, instead of stretching every decode
  step. Measured with the demo model: a 150 KB prompt stretched a running stream's step
  6.7 times at full priority, and 1.7 times at nice +10.

Before this, the step loop tokenized: a 1 MB prompt froze every stream on its model for
2.9 s, and a 15 MB one took 21.7 s to be refused.

A ready Request or EmbedJob goes to the engine's inbox; an answer (tokens, or an Error) is
emitted from here. Frames keep their arrival order through both stages, so admission stays
first come, first served.

Cancellation: a Cancel that arrives while its request is still here marks it; the request
is dropped before the next stage starts, and never handed over. The hand-over happens under
the same lock, so a Cancel that finds the request gone reaches the engine after it.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
from typing import TYPE_CHECKING, Callable, Protocol, Union

import msgspec

from worker.constraint import Matcher, as_lark
from worker.prompts import pooling_problem, texts_for
from worker.text_limits import Prepared, Texts, VocabModel
from worker.protocol import Constraint, Detokenize, Embed, Error, Frame, Generate, Render, Tokenize
from worker.rejected import RequestRejected
from worker.embed_inputs import check_per_token_size
from worker.request import EmbedJob, Request

if TYPE_CHECKING:
    from worker.media.projector import Projector

log = logging.getLogger("worker.prepare")

Work = Union[Generate, Embed, Tokenize, Detokenize, Render]
Ready = Union[Request, EmbedJob]
# Compiles a request's constraint (worker.constraint.Constraints.matcher in the worker);
# raises RequestRejected naming the parameter when it does not compile.
Compile = Callable[[Constraint], Matcher]

# How much lower than the decode threads the tokenizing thread runs (nice is -20..19).
NICE = 10


class PreparedModel(VocabModel, Protocol):
    """What preparing needs of a loaded model (worker.model.LoadedModel in the worker)."""

    @property
    def n_batch(self) -> int: ...

    @property
    def pooling(self) -> str | None: ...

    @property
    def n_embd(self) -> int: ...


class Preparer:
    def __init__(
        self,
        m: PreparedModel,
        n_ctx_slot: int,
        embeddings: bool,
        deliver: Callable[[Ready], None],
        emit: Callable[[Frame], None],
        constrain: Compile | None = None,
        projector: Projector | None = None,
        n_adapters: int = 0,
    ) -> None:
        self.m = m
        self.n_adapters = n_adapters  # LoRA adapters loaded: the indices Generate.adapters may name
        self._projector = projector  # a model's mmproj: prompts with images (worker/media/)
        self._constrain = constrain
        self.n_ctx_slot = n_ctx_slot
        self.embeddings = embeddings
        self._deliver = deliver  # the engine's inbox: thread-safe, never blocks
        self._emit = emit  # the link's writer: thread-safe, never blocks
        self._to_render: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        # Each request's texts, and its compiled constraint where it has one.
        self._to_tokenize: queue.SimpleQueue[tuple[int, Texts, Matcher | None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending: set[int] = set()
        self._cancelled: set[int] = set()
        self._render = threading.Thread(target=self._render_loop, name="render", daemon=True)
        self._tokenize = threading.Thread(target=self._tokenize_loop, name="tokenize", daemon=True)

    # ---- any thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self._render.start()
        self._tokenize.start()

    def submit(self, frame: Work) -> None:
        """Queue a frame; never blocks."""
        with self._lock:
            self._pending.add(frame.id)
        self._to_render.put(frame)

    def cancel(self, rid: int) -> None:
        """Drop request `rid` if it is still here. Never blocks."""
        with self._lock:
            if rid in self._pending:
                self._cancelled.add(rid)

    @property
    def pending(self) -> int:
        """Requests here, waiting or being prepared: they count as queued."""
        return len(self._pending)

    @property
    def native_ids(self) -> tuple[int | None, int | None]:
        """The OS ids of the render and the tokenize thread (nice is set per thread)."""
        return self._render.native_id, self._tokenize.native_id

    # ---- the threads --------------------------------------------------------------------------

    def _render_loop(self) -> None:
        while (frame := self._to_render.get()) is not None:
            if self._dropped(frame.id):
                continue
            try:
                texts, frame = self._texts(frame)
                constraint = frame.params.constraint if isinstance(frame, Generate) else None
                matcher = self._compile(constraint) if constraint is not None else None
                self._to_tokenize.put((frame.id, texts, matcher))
            except Exception as exc:
                self._hand_over(frame.id, _error(frame.id, exc))
        self._to_tokenize.put(None)

    def _tokenize_loop(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except OSError as exc:  # not Linux, or a sandbox that forbids it: run at par
            log.warning("could not lower the tokenizing thread's priority: %s", exc)
        while (item := self._to_tokenize.get()) is not None:
            rid, texts, matcher = item
            if self._dropped(rid):
                continue
            try:
                out: Prepared = texts.tokenize(self.m)
                if isinstance(out, Request):
                    out.matcher = matcher
                elif isinstance(out, EmbedJob) and self.m.pooling == "none":
                    check_per_token_size(out, self.m.n_embd)
            except Exception as exc:
                out = _error(rid, exc)
            self._hand_over(rid, out)

    def _texts(self, frame: Work) -> tuple[Texts, Work]:
        """Stage 1 of `frame`, and the frame as prepared (a GBNF constraint now Lark)."""
        if isinstance(frame, Generate) and self.embeddings:
            raise RequestRejected("unsupported", "this model serves embeddings only (embeddings = true)", "model")
        if isinstance(frame, Embed):
            if not self.embeddings:
                raise RequestRejected(
                    "unsupported", "this model does not serve embeddings (set embeddings = true)", "model"
                )
            if frame.rank_query is not None:
                if self.m.pooling != "rank":
                    raise RequestRejected(
                        "unsupported", 'this model is not a reranker: /rerank needs pooling = "rank" in its config', "model"
                    )
            elif (problem := pooling_problem(self.m.pooling or "", frame.native)) is not None:
                raise RequestRejected("unsupported", problem, "model")
        if isinstance(frame, Generate) and frame.adapters:
            bad = [i for i, scale in frame.adapters if not 0 <= i < self.n_adapters or not math.isfinite(scale)]
            if bad:  # the router sends none of these; a frame that does cannot crash the engine
                raise RequestRejected("invalid_request", f"no LoRA adapter {bad[0]} with a finite scale is loaded", "lora")
        if isinstance(frame, Generate) and frame.params.constraint is not None:
            # GBNF converts in Python, holding the GIL: here, at full priority (as_lark).
            lark = as_lark(frame.params.constraint)
            if lark is not frame.params.constraint:
                frame = msgspec.structs.replace(frame, params=msgspec.structs.replace(frame.params, constraint=lark))
        return texts_for(frame, self.m, self.n_ctx_slot, self.m.n_batch, self._projector), frame

    def _compile(self, c: Constraint) -> Matcher:
        if self._constrain is None:
            raise RequestRejected("unsupported", "this worker does not enforce grammars", c.param)
        return self._constrain(c)

    def _dropped(self, rid: int) -> bool:
        """True, and forgotten, if `rid` was cancelled while it waited."""
        with self._lock:
            if rid in self._cancelled:
                self._cancelled.discard(rid)
                self._pending.discard(rid)
                return True
            return False

    def _hand_over(self, rid: int, out: Prepared) -> None:
        with self._lock:
            self._pending.discard(rid)
            if rid in self._cancelled:
                self._cancelled.discard(rid)
                return
            if isinstance(out, (Request, EmbedJob)):
                self._deliver(out)
            else:
                self._emit(out)


def _error(rid: int, exc: Exception) -> Error:
    """The Error frame for a request that could not be prepared: a rejection says why; a
    bug costs this request, never the worker."""
    if isinstance(exc, RequestRejected):
        return Error(
            id=rid, code=exc.code, message=exc.message, param=exc.param,
            n_prompt_tokens=exc.n_prompt_tokens, n_ctx=exc.n_ctx,
        )
    log.exception("preparing request %d failed", rid, exc_info=exc)
    return Error(id=rid, code="internal", message=f"could not prepare the request: {exc}")
