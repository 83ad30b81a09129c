"""From a request's text to its tokens, with the length checks that protect the worker.

Tokenizing is the one cost a request's text imposes before it is known to fit, and that cost
grows with the text: about 1.4 µs a byte on the demo model, and quadratically with special
tokens (600 KB of `<start_of_turn>` takes 5.6 s). So a text that cannot fit is refused by
its length alone, before it is tokenized. Every token covers at most `max_token_bytes` bytes
of text, so n bytes make at least ceil(n / max_token_bytes) tokens. The bound errs in one
direction only: it never refuses a text that would fit. A text it lets through is tokenized
and checked exactly.

Preparing a request therefore has two stages, which worker/preparer.py runs on two threads:
1. `*_texts`: render the chat template and check byte lengths. This holds the GIL, so it
   must run at full priority, but it is cheap per byte (a 15 MB prompt costs milliseconds).
2. `Texts.tokenize`: tokenize (llama.cpp drops the GIL) and check exact counts, then build
   the Request, EmbedJob or TokenizeResult.

Pure logic over the `TextModel` protocol, so it is tested with a fake tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Union

from worker.chat_template import ChatTemplate, TemplateError, TemplateTooLong
from worker.protocol import Embed, Frame, Generate, Tokenize, TokenizeResult, fewest_tokens, utf8_length
from worker.request import EmbedJob, Request, RequestRejected
from worker.stops import StopMatcher

# Pooling types whose output is one vector per input, which is what /v1/embeddings returns.
EMBEDDING_POOLINGS = ("mean", "cls", "last")

Prepared = Union[Request, EmbedJob, Frame]


class TextModel(Protocol):
    """What preparing a request needs of a model."""

    @property
    def template(self) -> ChatTemplate | None: ...

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def max_token_bytes(self) -> int | None:
        """The most bytes of text one token can cover, or None where no such bound holds
        (tokenizers that normalise text, which can fold many bytes into one token)."""
        ...

    @property
    def n_vocab(self) -> int: ...

    def detokenize(self, tokens: list[int]) -> str:
        """The text of a token prompt, for `echo`."""
        ...


def check_token_ids(tokens: list[int], n_vocab: int, param: str) -> None:
    """Refuse token ids outside the vocabulary: llama.cpp reads them as indices, and an
    id past the end is a read out of bounds, not an error."""
    for t in tokens:
        if not 0 <= t < n_vocab:
            raise RequestRejected(
                "invalid_request", f"token id {t} is outside this model's vocabulary (0 .. {n_vocab - 1})", param
            )


@dataclass(frozen=True)
class Limit:
    """At most `most` tokens; an error reads "{what} is N tokens; {why}" and names `param`."""

    most: int
    what: str
    why: str
    param: str

    def refuse(self, tokens: str) -> RequestRejected:
        return RequestRejected("context_length_exceeded", f"{self.what} is {tokens} tokens; {self.why}", self.param)

    def check_bytes(self, n_bytes: int, max_token_bytes: int | None) -> None:
        """Refuse a text of `n_bytes` that certainly makes more than `most` tokens."""
        at_least = fewest_tokens(n_bytes, max_token_bytes)
        if at_least > self.most:
            raise self.refuse(f"at least {at_least}") from None


@dataclass(frozen=True)
class Texts:
    """Stage 1's result: texts short enough to tokenize, each with its limit, and what to
    build from their tokens."""

    texts: list[tuple[str, Limit]]
    build: Callable[[list[list[int]]], Prepared]
    add_special: bool = True

    def tokenize(self, m: TextModel) -> Prepared:
        """Stage 2: tokenize each text, check its exact count, and build the result."""
        tokens = []
        for text, limit in self.texts:
            toks = m.tokenize(text, add_special=self.add_special, parse_special=True)
            if len(toks) > limit.most:
                raise limit.refuse(str(len(toks)))
            tokens.append(toks)
        return self.build(tokens)


def _checked(text: str, limit: Limit, m: TextModel) -> tuple[str, Limit]:
    """`text`, refused if its byte length alone shows it is too long. Each token covers at
    least one byte, so a text shorter than the limit in bytes never asks for the bound."""
    n_bytes = utf8_length(text)
    if n_bytes > limit.most:
        limit.check_bytes(n_bytes, m.max_token_bytes())
    return text, limit


def generate_texts(g: Generate, m: TextModel, n_ctx_slot: int) -> Texts:
    """Stage 1 of a generation: the prompt rendered and its length bounded."""
    param = "messages" if g.messages is not None else "prompt"
    limit = Limit(
        n_ctx_slot - 1,
        "the prompt",
        f"this model's context holds {n_ctx_slot} tokens, prompt and output together",
        param,
    )
    if g.params.logit_bias:
        check_token_ids(list(g.params.logit_bias), m.n_vocab, "logit_bias")
    if g.n < 1:
        raise RequestRejected("invalid_request", "n must be at least 1", "n")
    if g.prompt_tokens is not None:
        return _token_prompt(g, m, n_ctx_slot, limit)
    if g.messages is None:
        text = g.prompt or ""
    elif m.template is None:
        raise RequestRejected(
            "unsupported",
            "this model has no chat template; set chat_template in its config or use "
            "/v1/completions",
            "messages",
        )
    else:
        bound = m.max_token_bytes()
        try:
            text = m.template.render(g.messages, limit.most * bound if bound else None)
        except TemplateTooLong as exc:
            raise limit.refuse(f"at least {fewest_tokens(exc.n_bytes, bound)}") from None
        except TemplateError as exc:
            raise RequestRejected("invalid_request", f"chat template: {exc}", "messages") from None

    def build(tokens: list[list[int]]) -> Request:
        prompt = tokens[0]
        if not prompt:
            raise RequestRejected("invalid_request", "the prompt is empty", param)
        room = n_ctx_slot - len(prompt)
        return _request(g, prompt, n_ctx_slot, text if g.echo else None)

    return Texts([_checked(text, limit, m)], build)


def _request(g: Generate, prompt: list[int], n_ctx_slot: int, echo: str | None) -> Request:
    room = n_ctx_slot - len(prompt)
    p = g.params
    max_new = room if p.max_tokens is None else min(p.max_tokens, room)
    return Request(
        id=g.id, params=p, prompt=prompt, max_new=max_new, stops=StopMatcher(tuple(p.stop)), n=g.n, echo=echo
    )


def _token_prompt(g: Generate, m: TextModel, n_ctx_slot: int, limit: Limit) -> Texts:
    """A prompt sent as token ids: nothing to tokenize, only ids and length to check."""
    tokens = list(g.prompt_tokens or [])
    if not tokens:
        raise RequestRejected("invalid_request", "the prompt is empty", "prompt")
    if len(tokens) > limit.most:
        raise limit.refuse(str(len(tokens)))
    check_token_ids(tokens, m.n_vocab, "prompt")

    def build(_: list[list[int]]) -> Request:
        return _request(g, tokens, n_ctx_slot, m.detokenize(tokens) if g.echo else None)

    return Texts([], build)


def embed_texts(e: Embed, m: TextModel, n_batch: int) -> Texts:
    """Stage 1 of an embedding request: every input must fit one batch."""
    if e.tokens is not None:
        return _embed_tokens(e, m, n_batch)
    texts = []
    for i, text in enumerate(e.inputs):
        if not text:
            raise RequestRejected("invalid_request", f"input[{i}] is empty", "input")
        texts.append(_checked(text, Limit(n_batch, f"input[{i}]", f"this model embeds at most {n_batch}", "input"), m))

    def build(tokens: list[list[int]]) -> EmbedJob:
        for i, toks in enumerate(tokens):
            if not toks:
                raise RequestRejected("invalid_request", f"input[{i}] makes no tokens", "input")
        return EmbedJob(id=e.id, inputs=tokens)

    return Texts(texts, build)


def _embed_tokens(e: Embed, m: TextModel, n_batch: int) -> Texts:
    """Token-array inputs: checked as texts are once tokenized, and against the vocabulary."""
    inputs = [list(t) for t in e.tokens or []]
    if not inputs:
        raise RequestRejected("invalid_request", "input is empty", "input")
    for i, toks in enumerate(inputs):
        if not toks:
            raise RequestRejected("invalid_request", f"input[{i}] is empty", "input")
        if len(toks) > n_batch:
            raise Limit(n_batch, f"input[{i}]", f"this model embeds at most {n_batch}", "input").refuse(str(len(toks)))
        check_token_ids(toks, m.n_vocab, "input")

    def build(_: list[list[int]]) -> EmbedJob:
        return EmbedJob(id=e.id, inputs=inputs)

    return Texts([], build)


def tokenize_texts(t: Tokenize, m: TextModel, n_ctx_slot: int) -> Texts:
    """Stage 1 of POST /tokenize. A text longer than any prompt this model can take is
    refused rather than tokenized: it cannot be a prompt, and tokenizing it costs without
    bound."""
    limit = Limit(n_ctx_slot, "the text", f"/tokenize takes at most {n_ctx_slot} tokens with this model (its context)", "content")

    def build(tokens: list[list[int]]) -> TokenizeResult:
        return TokenizeResult(id=t.id, tokens=tokens[0])

    return Texts([_checked(t.text, limit, m)], build, add_special=t.add_special)


def pooling_problem(pooling: str) -> str | None:
    """Why a model with this pooling cannot answer /v1/embeddings, or None if it can."""
    if pooling in EMBEDDING_POOLINGS:
        return None
    if pooling == "rank":
        why = "'rank' pooling makes a reranker's relevance score, not an embedding"
    else:
        why = f"{pooling!r} pooling gives one vector per token, not one per input"
    return f"{why}; /v1/embeddings needs pooling = mean, cls or last in this model's config"


def texts_for(frame: Generate | Embed | Tokenize, m: TextModel, n_ctx_slot: int, n_batch: int) -> Texts:
    """Stage 1 for any request frame."""
    if isinstance(frame, Generate):
        return generate_texts(frame, m, n_ctx_slot)
    if isinstance(frame, Embed):
        return embed_texts(frame, m, n_batch)
    return tokenize_texts(frame, m, n_ctx_slot)
