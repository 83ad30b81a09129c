"""What the engine works on: a generation with its tokens, or an embedding job.

Both are built by the preparing threads (worker/preparer.py) from a frame, with the prompt
already tokenized and checked, and handed to the engine's step loop whole.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from worker.protocol import ErrorCode, SamplingParams
from worker.sampling import SamplerChain
from worker.slots import Slot
from worker.stops import StopMatcher

if TYPE_CHECKING:  # worker.constraint imports this module for RequestRejected
    from worker.constraint import Matcher
    from worker.logits import LogitsAdjustment


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

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt)

    def logit_adjustments(self) -> list[LogitsAdjustment]:
        """What edits this request's logits before each sample (worker/logits.py), in order;
        the grammar's mask comes last, so that nothing can lift a token it forbids."""
        return [] if self.matcher is None else [self.matcher]


@dataclass(frozen=True)
class EmbedJob:
    """An embedding request whose inputs are tokenized and within the batch size."""

    id: int
    inputs: list[list[int]]


class RequestRejected(Exception):
    """The request cannot be served as sent: its Error frame, ready to emit."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        param: str | None = None,
        n_prompt_tokens: int | None = None,
        n_ctx: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param
        # A context overflow's counts, which llama-server's error shape reports.
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx
