"""Structured output: a grammar enforced token by token, with llguidance.

Why llguidance and not llama.cpp's grammar sampler: on the demo model's 262k-token
vocabulary, llama.cpp's sampler costs milliseconds a token applied to the whole vocabulary,
while llguidance fills its token mask in a fraction of that (bench/constraint_engines.py,
figures in docs/api.md, "Structured output"). It also reads JSON schemas itself (no GBNF
conversion), Lark (which forced tool calls use, with `%json { schema }` inside), and GBNF.

Three pieces, each with its own cost and thread:
- `Constraints.tokenizer()`: llguidance's view of the vocabulary, built once per model (one
  to two seconds on 262k tokens, holding the GIL throughout), while the model loads
  (worker/link.py), before any stream can run; only if that failed, by the first
  constrained request.
- `Constraints.matcher(c)`: compiles one request's grammar, on a preparing thread before the
  request can take a slot; a grammar that does not compile is a RequestRejected naming the
  request parameter it came from.
- `Matcher`: the per-request state on the engine thread: `apply(logits)` masks every token
  the grammar forbids (a worker.logits adjustment), `consume(token)` advances it.
"""

from __future__ import annotations

import ctypes
import json
import threading
from typing import TYPE_CHECKING, Callable, cast

import llama_cpp
import llguidance
import numpy as np
from llguidance.gbnf_to_lark import any_to_lark

from worker import vocab_pieces
from worker.logits import Logits
from worker.protocol import JSON_LAYOUT, Constraint
from worker.rejected import RequestRejected
from worker.vocab_pieces import Pieces

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

JSON_OPTIONS = cast("JsonCompileOptions", JSON_LAYOUT)  # see JSON_LAYOUT
# Limits on what one grammar may cost (llguidance's defaults), with short errors: a verbose
# one quotes parser state, which is neither short nor the client's business.
LIMITS = llguidance.LLParserLimits(verbose_errors=False)
MAX_MESSAGE = 400


class ConstraintFailed(Exception):
    """The matcher of a running request went into its error state."""


def grammar_of(c: Constraint) -> str:
    """llguidance's grammar text for a constraint. ValueError when it cannot be read at all
    (a JSON schema that is not JSON, a GBNF grammar that does not convert)."""
    if c.kind == "json_schema":
        schema = json.loads(c.source)
        if not isinstance(schema, dict):
            raise ValueError("a JSON schema must be an object")
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    if c.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(c.source)
    return llguidance.grammar_from("gbnf", c.source)


def as_lark(c: Constraint) -> Constraint:
    """A GBNF constraint converted to Lark; any other kind as it is.

    llguidance converts GBNF in pure Python (about 4 µs a byte), holding the GIL. So this
    runs on the render thread, at full priority: on the low-priority tokenize thread a large
    grammar would hold the GIL while starved of CPU, and the engine thread would wait on it
    (worker/preparer.py). The router also caps a grammar's length."""
    if c.kind != "gbnf":
        return c
    try:
        return Constraint(kind="lark", source=any_to_lark(c.source), param=c.param)
    except Exception as exc:  # the converter raises what its parser meets, not one type
        raise RequestRejected("invalid_request", f"{c.param}: invalid GBNF grammar: {_short(str(exc))}", c.param) from None


def describe(c: Constraint) -> str:
    return {"json_schema": "JSON schema", "lark": "grammar", "gbnf": "GBNF grammar"}[c.kind]


# llguidance marks some errors for its own logs; a client has no use for the marker.
_LOG_MARKER = "<non-verbose/>"
NOTHING_ALLOWED = "the grammar allows no token here"


def _short(message: str) -> str:
    message = " ".join(message.replace(_LOG_MARKER, "").split())
    if message == "NoExtensionBias":  # llguidance's name for a mask with nothing in it
        return NOTHING_ALLOWED
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


def tokenizer_for(
    vocab: llama_cpp.llama_vocab_p, n_vocab: int, is_eog: Callable[[int], bool], pieces: Pieces | None = None
) -> llguidance.LLTokenizer:
    """llguidance's tokenizer over a llama.cpp vocabulary, from its tokens' bytes (worker/
    vocab_pieces.py; built here when not given). Every end-of-generation token counts as
    EOS, so that the grammar allows any of them (gemma ends a turn with <end_of_turn>, not
    <eos>) exactly where the output may end. What llguidance.llamacpp.lltokenizer_from_vocab
    does, with the bytes taken from a cache."""
    if pieces is None:
        pieces = vocab_pieces.build(vocab, n_vocab, is_eog)
    tokenize = ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    return llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined,no-any-return]
        tokens=pieces.tokens, vocab_ptr=vocab, tokenize_fptr=tokenize,
        eos_token=pieces.eog or int(llama_cpp.llama_vocab_eos(vocab)), slices=None,
    )


class Matcher:
    """One request's grammar state. Engine thread only."""

    def __init__(self, matcher: llguidance.LLMatcher, n_vocab: int) -> None:
        self._m = matcher
        self._n_vocab = n_vocab
        self._words = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    def apply(self, logits: Logits) -> None:
        """Set every forbidden token's logit to -inf. EOS tokens are allowed only where the
        grammar may end."""
        self._m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        if self._m.is_error():
            raise ConstraintFailed(_short(self._m.get_error()))
        if not self._words.any():
            # Nothing allowed, not even EOS: llama.cpp's dist sampler over all -inf is
            # undefined, so this ends the request instead.
            raise ConstraintFailed(NOTHING_ALLOWED)
        # One bit per token, lowest bit first; unpacking and a masked copy take about
        # 0.2 ms on 262k logits (boolean indexing or putmask take 0.25 ms or more).
        allowed = np.unpackbits(self._words.view(np.uint8), count=len(logits), bitorder="little").view(bool)
        np.copyto(logits, np.float32(-np.inf), where=~allowed)

    def fork(self) -> Matcher:
        """An independent copy in the same state: each of n choices follows its own path
        through the grammar, and copying skips compiling it n times."""
        return Matcher(self._m.deep_copy(), self._n_vocab)

    def consume(self, token: int) -> None:
        if not self._m.consume_token(token):
            raise ConstraintFailed(_short(self._m.get_error() or f"token {token} was not allowed"))

    @property
    def stopped(self) -> bool:
        """The grammar is complete and allows nothing more but EOS: the answer is whole."""
        return bool(self._m.is_stopped())


class Constraints:
    """One model's constraint compiler. Thread-safe: the preparing threads call it.

    `build` gives llguidance's tokenizer (in the worker, the one built at load, else
    `tokenizer_for` over the model's vocabulary); it is called once, by the first
    constrained request."""

    def __init__(self, build: Callable[[], llguidance.LLTokenizer], n_vocab: int) -> None:
        self._build, self._n_vocab = build, n_vocab
        self._lock = threading.Lock()
        self._tokenizer: llguidance.LLTokenizer | None = None

    def tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = self._build()
            return self._tokenizer

    def matcher(self, c: Constraint) -> Matcher:
        """A fresh matcher for `c`, or RequestRejected naming `c.param` when it does not
        compile."""
        try:
            grammar = grammar_of(c)
        except (ValueError, TypeError) as exc:
            raise RequestRejected("invalid_request", f"{c.param}: invalid {describe(c)}: {_short(str(exc))}", c.param) from None
        m = llguidance.LLMatcher(self.tokenizer(), grammar, log_level=0, limits=LIMITS)
        if m.is_error():
            raise RequestRejected(
                "invalid_request", f"{c.param}: the {describe(c)} cannot be enforced: {_short(m.get_error())}", c.param
            )
        return Matcher(m, self._n_vocab)


def compile_constraint(tokenizer: llguidance.LLTokenizer, c: Constraint) -> str:
    """The grammar text for `c`, checked against `tokenizer` (for the engine benchmark)."""
    grammar = grammar_of(c)
    err = llguidance.LLMatcher.validate_grammar(grammar, tokenizer, limits=LIMITS)
    if err:
        raise ValueError(err)
    return grammar
