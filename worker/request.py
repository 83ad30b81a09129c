"""What the engine works on: a generation with its tokens, or an embedding job.

Both are built by the preparing threads (worker/preparer.py) from a frame, with the prompt
already tokenized and checked, and handed to the engine's step loop whole.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from worker.adapter_turns import AdapterSet
from worker.logits import LogitBias, LogitsAdjustment
from worker.logprobs import LogprobQueue
from worker.media.spans import ImageSpan, text_ahead
from worker.ngram_draft import Drafter
from worker.protocol import SamplingParams, SlotState
from worker.sampling import SamplerChain
from worker.slots import Slot
from worker.stops import StopMatcher

if TYPE_CHECKING:  # only the type: worker.constraint pulls in llguidance
    from worker.constraint import Matcher


@dataclass(eq=False)
class Request:
    id: int
    params: SamplingParams
    prompt: list[int]
    max_new: int
    stops: StopMatcher
    # The prompt ended inside an open <think> block; told to the router with the first event.
    in_reasoning: bool = False
    announced: bool = False  # the first event has been sent
    tokens: list[int] = field(default_factory=list)  # prompt + generated, as it should be in KV
    n_gen: int = 0
    cached: int = 0  # prompt tokens reused from the slot's cache
    preempted: bool = False
    kv_redone: bool = False  # its cells were dropped by the KV check once (KvRoom._redo)
    sampler: SamplerChain | None = None
    # The grammar its output must match (params.constraint, compiled while preparing). It
    # lives as long as the request: a preempted request keeps it, and its generated tokens,
    # already consumed, are decoded again but never fed to it twice.
    matcher: Matcher | None = None
    slot: Slot[Request] | None = None
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )
    # perf_counter stamps for llama-server's timings: when the request took its slot (its
    # prompt's decoding begins) and when its first token was sampled (the prompt is done).
    t_admitted: float = 0.0
    t_prompt_done: float = 0.0
    index: int = 0  # which of the Generate's n choices this is
    request_id: str | None = None  # the HTTP request's id, for log lines
    n: int = 1  # the Generate's n: the engine splits a request into n siblings
    echo: str | None = None  # the prompt's text, sent once with this choice's first event
    # A sibling that will sample its first token from this request's prompt logits (and
    # copy its prompt's KV cells) instead of evaluating the prompt itself.
    follows: Request | None = None
    # A request still prefilling the same long prefix (worker/prefix_reuse.py,
    # follow_target): this one decodes nothing until that one's cache holds `await_n`
    # tokens, then copies those cells.
    awaits: Request | None = None
    await_n: int = 0
    logprobs: LogprobQueue | None = None
    # Speculative decoding's n-gram drafts (worker/ngram_draft.py); None: this request
    # decodes one token a step (speculation off, or it needs every token's logits alone).
    drafter: Drafter | None = None
    model_draft: list[int] = field(default_factory=list)  # a draft model's, for this step
    scope: str = ""  # Generate.cache_scope: whose cached prefixes it may reuse
    # The prompt's images, in order: spans of placeholder ids in `prompt` whose embeddings
    # the engine decodes (worker/media/steps.py); text never goes into a batch past one.
    images: tuple[ImageSpan, ...] = ()
    rank: int = 1  # Generate.priority: its class in the slot line, lower first
    # Generate.adapters: the LoRA set it decodes under (worker/adapter_turns.py), which its
    # scope names too, so that no prefix crosses sets.
    adapters: AdapterSet = ()

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt)
        if self.params.logprobs is not None and self.logprobs is None:
            self.logprobs = LogprobQueue()
        self._bias = LogitBias(self.params.logit_bias) if self.params.logit_bias else None

    def siblings(self) -> list[Request]:
        """Choices 1 .. n-1 of this request (choice 0): the same prompt and parameters,
        each with its own stop matcher and decoder; a given seed becomes seed + i, so the
        choices differ yet repeat from run to run."""
        out = []
        for i in range(1, self.n):
            p = self.params
            if p.seed is not None:
                p = msgspec.structs.replace(p, seed=p.seed + i)
            out.append(
                Request(
                    id=self.id, params=p, prompt=list(self.prompt), max_new=self.max_new,
                    stops=StopMatcher(self.stops.stops), index=i, echo=self.echo,
                    in_reasoning=self.in_reasoning, request_id=self.request_id,
                    matcher=self.matcher.fork() if self.matcher is not None else None, scope=self.scope,
                    images=self.images, rank=self.rank, adapters=self.adapters,
                )
            )
        self.n = 1  # split once
        return out

    @property
    def label(self) -> str:
        """How log lines name this request: the HTTP request's id where known."""
        return f"{self.id} ({self.request_id})" if self.request_id else str(self.id)

    def logit_adjustments(self) -> list[LogitsAdjustment]:
        """What edits this request's logits before each sample (worker/logits.py), in order:
        its logit_bias, then the grammar's mask, so that no bias can lift a token the
        grammar forbids."""
        edits: list[LogitsAdjustment] = []
        if self._bias is not None:
            edits.append(self._bias)
        if self.matcher is not None:
            edits.append(self.matcher)
        return edits


@dataclass(frozen=True)
class EmbedJob:
    """An embedding request whose inputs are tokenized and within the batch size."""

    id: int
    inputs: list[list[int]]
    scores: bool = False  # a reranker's: read the scores, not a normalised vector
    normalize: int = 2  # Embed.normalize


def pending_tokens(slot: Slot[Request]) -> int:
    """The tokens of a slot's request that its cache does not hold yet (none for a sibling
    that will share another request's prompt, nor for a request waiting to copy a prefix
    another one is decoding)."""
    assert slot.request is not None
    req = slot.request
    if req.follows is not None or req.awaits is not None:
        return 0
    if req.images:  # up to the next image, which the image step decodes
        return text_ahead(req.images, len(slot.cache), len(req.tokens))
    return len(req.tokens) - len(slot.cache)


def slot_states(slots: list[Slot[Request]], n_ctx: int) -> list[SlotState]:
    """What each slot is doing (GET /slots). Called from the link's thread, not the
    engine's: it only reads, and a reading a step old is as good as a fresh one."""
    out = []
    for s in slots:
        req = s.request
        state = SlotState(id=s.id, n_ctx=n_ctx, is_processing=req is not None, n_cached=len(s.cache))
        if req is not None:
            state.id_task, state.n_decoded, state.params = req.id, req.n_gen, req.params
            state.n_remain = req.max_new - req.n_gen
        out.append(state)
    return out
