"""The length checks every text a worker tokenizes goes through, and the two-stage shape of
preparing one (worker/prompts.py says why): `Limit` (how many tokens, and the refusal),
`Texts` (stage 1's result, tokenized in stage 2), the byte bound, the id check.

Pure logic over the `TextModel` protocol, so it is tested with a fake tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, Union

from worker.chat_template import ChatTemplate
from worker.fim_tokens import FimTokens
from worker.protocol import Frame, fewest_tokens, utf8_length
from worker.rejected import RequestRejected
from worker.request import EmbedJob, Request

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


@dataclass(frozen=True)
class RerankShape:
    """How a query and a document make one reranker input (llama-server's
    format_prompt_rerank): the GGUF's "rerank" template with {query} and {document}, or
    else BOS, query, EOS, SEP, document, EOS, each where the vocabulary asks for it."""

    template: str | None = None
    bos: int | None = None
    eos: int | None = None
    sep: int | None = None


class VocabModel(TextModel, Protocol):
    """What the requests that name token ids need besides: the vocabulary's size (every id
    a client sends is checked against it) and the text of tokens."""

    @property
    def n_vocab(self) -> int: ...

    def detokenize(self, tokens: list[int]) -> str:
        """The text of `tokens`, special tokens written out."""
        ...

    def token_text(self, token: int) -> bytes:
        """One token's bytes, a special token's text included."""
        ...

    @property
    def fim(self) -> FimTokens:
        """Its fill-in-the-middle tokens (llama-server's /infill)."""
        ...

    @property
    def bos_id(self) -> int | None:
        """The BOS token a prompt starts with, or None where the model adds none."""
        ...

    def output_text(self, tokens: list[int]) -> str:
        """The text of `tokens` as output writes it (what `echo` prepends)."""
        ...

    @property
    def rerank_shape(self) -> RerankShape:
        """How this model's reranker inputs are laid out."""
        ...


@dataclass(frozen=True)
class Limit:
    """At most `most` tokens; an error reads "{what} is N tokens; {why}" and names `param`."""

    most: int
    what: str
    why: str
    param: str
    n_ctx: int | None = None  # the context reported with a refusal (llama-server's n_ctx)
    cut: bool = False  # a longer text keeps its first `most` tokens instead of being refused

    def refuse(self, n_tokens: int, at_least: bool = False) -> RequestRejected:
        count = f"at least {n_tokens}" if at_least else str(n_tokens)
        return RequestRejected(
            "context_length_exceeded", f"{self.what} is {count} tokens; {self.why}", self.param,
            n_prompt_tokens=n_tokens, n_ctx=self.n_ctx,
        )

    def check_bytes(self, n_bytes: int, max_token_bytes: int | None) -> None:
        """Refuse a text of `n_bytes` that certainly makes more than `most` tokens."""
        at_least = fewest_tokens(n_bytes, max_token_bytes)
        if at_least > self.most:
            raise self.refuse(at_least, at_least=True) from None


@dataclass(frozen=True)
class Texts:
    """Stage 1's result: texts short enough to tokenize, each with its limit, and what to
    build from their tokens."""

    texts: list[tuple[str, Limit]]
    build: Callable[[list[list[int]]], Prepared]
    # BOS and the like: for every text, or text by text (a mixed prompt adds them only to a
    # string that comes first).
    add_special: bool | Sequence[bool] = True
    parse_special: bool | Sequence[bool] = True  # the same, for reading special tokens

    def tokenize(self, m: TextModel) -> Prepared:
        """Stage 2: tokenize each text, check its exact count, and build the result."""
        tokens = []
        for i, (text, limit) in enumerate(self.texts):
            add = self.add_special if isinstance(self.add_special, bool) else self.add_special[i]
            parse = self.parse_special if isinstance(self.parse_special, bool) else self.parse_special[i]
            toks = m.tokenize(text, add_special=add, parse_special=parse)
            if len(toks) > limit.most and limit.cut:
                toks = toks[: limit.most]
            elif len(toks) > limit.most:
                raise limit.refuse(len(toks))
            tokens.append(toks)
        return self.build(tokens)


def checked(text: str, limit: Limit, m: TextModel) -> tuple[str, Limit]:
    """`text`, refused if its byte length alone shows it is too long. Each token covers at
    least one byte, so a text shorter than the limit in bytes never asks for the bound."""
    n_bytes = utf8_length(text)
    if n_bytes > limit.most and limit.cut:
        # Its first `most` tokens lie within its first most * max_token_bytes bytes: only
        # those are tokenized, so a huge text costs no more than one that fits.
        widest = m.max_token_bytes()
        if widest:
            keep = limit.most * widest
            return text.encode()[:keep].decode(errors="ignore"), limit
        return text, limit
    if n_bytes > limit.most:
        limit.check_bytes(n_bytes, m.max_token_bytes())
    return text, limit


def check_ids(tokens: Sequence[int | str], n_vocab: int, param: str) -> None:
    """Every token id a client sent must name a token of this vocabulary: llama.cpp reads
    an id out of range past the end of its tables."""
    for i, t in enumerate(tokens):
        if isinstance(t, int) and not 0 <= t < n_vocab:
            raise RequestRejected(
                "invalid_request",
                f"Invalid token id {t} at {param}[{i}]: this model's vocabulary has ids 0 to {n_vocab - 1}.",
                param,
            )
