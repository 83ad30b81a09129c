"""worker/constraint.py over a byte-level fake vocabulary (no model): what each constraint
kind compiles to, the mask it puts on the logits, its errors naming the request parameter,
and the preparing thread that compiles it before a request can take a slot."""

from __future__ import annotations

import json
import queue
from typing import Any

import llguidance
import numpy as np
import pytest

from worker.constraint import NOTHING_ALLOWED, ConstraintFailed, Constraints, Matcher, as_lark
from worker.preparer import Preparer
from worker.protocol import Constraint, Error, Frame, Generate, SamplingParams
from worker.rejected import RequestRejected
from worker.request import EmbedJob, Request

EOS = 0
N_VOCAB = 257  # token 0 is EOS, token b + 1 is byte b


class ByteVocab:
    """What llguidance.TokenizerWrapper reads: one token per byte, plus EOS."""

    eos_token_id = EOS
    bos_token_id = None
    tokens = [b"\xff<eos>"] + [bytes([i]) for i in range(256)]
    special_token_ids = [EOS]

    def __call__(self, s: bytes | str) -> list[int]:
        data = s.encode() if isinstance(s, str) else s
        return [b + 1 for b in data]


def byte_tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteVocab()))


def tok(ch: str) -> int:
    return ord(ch) + 1


def allowed(m: Matcher) -> set[int]:
    logits = np.zeros(N_VOCAB, dtype=np.float32)
    m.apply(logits)
    return set(np.flatnonzero(np.isfinite(logits)).tolist())


def run_greedy(m: Matcher, limit: int = 200) -> str:
    """Follow the lowest allowed token until the grammar is complete: the text a grammar
    that allows exactly one answer forces."""
    out = bytearray()
    for _ in range(limit):
        if m.stopped:
            return out.decode()
        choices = allowed(m) - {EOS}
        assert choices, f"no token allowed after {out!r}"
        t = min(choices)
        m.consume(t)
        out.append(t - 1)
    raise AssertionError("the grammar did not complete")


@pytest.fixture(scope="module")
def constraints() -> Constraints:
    return Constraints(byte_tokenizer, N_VOCAB)


def test_mask_allows_only_what_the_grammar_allows(constraints: Constraints) -> None:
    m = constraints.matcher(Constraint("gbnf", 'root ::= "ab"', "grammar"))
    assert allowed(m) == {tok("a")}
    m.consume(tok("a"))
    assert allowed(m) == {tok("b")}
    m.consume(tok("b"))
    assert m.stopped
    assert allowed(m) == {EOS}  # EOS only where the grammar may end


def test_eos_is_forbidden_until_the_grammar_may_end(constraints: Constraints) -> None:
    m = constraints.matcher(Constraint("gbnf", 'root ::= "a"+', "grammar"))
    assert EOS not in allowed(m)
    m.consume(tok("a"))
    assert allowed(m) == {tok("a"), EOS}
    assert not m.stopped  # more "a" may follow: the model decides, by EOS


def test_the_mask_keeps_the_logits_it_allows() -> None:
    m = Constraints(byte_tokenizer, N_VOCAB).matcher(Constraint("gbnf", 'root ::= [a-c]', "grammar"))
    logits = np.arange(N_VOCAB, dtype=np.float32)
    m.apply(logits)
    assert logits[tok("b")] == tok("b") and logits[tok("d")] == -np.inf


def test_a_forbidden_token_fails_the_matcher(constraints: Constraints) -> None:
    m = constraints.matcher(Constraint("gbnf", 'root ::= "ab"', "grammar"))
    with pytest.raises(ConstraintFailed):
        m.consume(tok("z"))
    with pytest.raises(ConstraintFailed):  # and it stays failed: the engine ends the request
        m.apply(np.zeros(N_VOCAB, dtype=np.float32))


def test_a_schema_with_no_finite_answer_fails_in_words_a_client_can_read(constraints: Constraints) -> None:
    # {"$ref": "#"} compiles, but no JSON value matches it: the first mask is empty.
    m = constraints.matcher(Constraint("json_schema", '{"$ref": "#"}', "response_format"))
    with pytest.raises(ConstraintFailed) as info:
        allowed(m)
    assert str(info.value) == NOTHING_ALLOWED  # not llguidance's "NoExtensionBias <non-verbose/>"


def test_json_schema_writes_compact_json_with_python_separators(constraints: Constraints) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"const": 1}, "b": {"type": "array", "items": {"const": "x"}, "minItems": 2, "maxItems": 2}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    m = constraints.matcher(Constraint("json_schema", json.dumps(schema), "response_format"))
    assert run_greedy(m) == '{"a": 1, "b": ["x", "x"]}'


def test_lark_with_embedded_json_compiles(constraints: Constraints) -> None:
    # What forced tool calls send: a Lark grammar around a %json schema.
    lark = 'start: "CALL " %json {"type": "object", "properties": {"n": {"const": 2}}, "required": ["n"]}'
    m = constraints.matcher(Constraint("lark", lark, "tool_choice"))
    assert allowed(m) == {tok("C")}


@pytest.mark.parametrize(
    "c",
    [
        Constraint("json_schema", "{not json", "json_schema"),
        Constraint("json_schema", "[1, 2]", "json_schema"),
        Constraint("json_schema", '{"type": "no-such-type"}', "response_format"),
        Constraint("json_schema", '{"properties": {"a": {"$ref": "#/$defs/none"}}}', "response_format"),
        Constraint("gbnf", "root ::= missing-rule", "grammar"),
        Constraint("gbnf", 'root ::= "a" (((', "grammar"),
        Constraint("lark", "start: %json {", "tool_choice"),
        Constraint("lark", "start: undefined_rule", "tool_choice"),
    ],
)
def test_what_does_not_compile_is_rejected_naming_its_parameter(constraints: Constraints, c: Constraint) -> None:
    with pytest.raises(RequestRejected) as info:
        constraints.matcher(c)
    assert info.value.code == "invalid_request"
    assert info.value.param == c.param
    assert info.value.message.startswith(c.param)
    assert len(info.value.message) < 600


def test_the_tokenizer_is_built_once_and_only_when_needed() -> None:
    built: list[int] = []

    def build() -> llguidance.LLTokenizer:
        built.append(1)
        return byte_tokenizer()

    cs = Constraints(build, N_VOCAB)
    assert built == []
    for _ in range(3):
        cs.matcher(Constraint("gbnf", 'root ::= "a"', "grammar"))
    assert built == [1]


# ---- the preparing thread compiles it -----------------------------------------------------------


class Model:
    template = None
    n_batch = 64
    pooling = None

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [1] + list(text.encode())

    def max_token_bytes(self) -> int | None:
        return 48


def prepare(frame: Generate, constrain: Any) -> Request | EmbedJob | Frame:
    delivered: queue.SimpleQueue[Request | EmbedJob | Frame] = queue.SimpleQueue()
    prep = Preparer(Model(), 4096, False, delivered.put, delivered.put, constrain=constrain)
    prep.start()
    prep.submit(frame)
    return delivered.get(timeout=5)


def constrained(c: Constraint) -> Generate:
    return Generate(id=7, params=SamplingParams(max_tokens=4, constraint=c), prompt="hi")


def test_a_constrained_request_arrives_with_its_matcher(constraints: Constraints) -> None:
    out = prepare(constrained(Constraint("gbnf", 'root ::= "a"', "grammar")), constraints.matcher)
    assert isinstance(out, Request) and isinstance(out.matcher, Matcher)
    assert out.logit_adjustments() == [out.matcher]


def test_an_unconstrained_request_has_no_matcher(constraints: Constraints) -> None:
    out = prepare(Generate(id=7, params=SamplingParams(max_tokens=4), prompt="hi"), constraints.matcher)
    assert isinstance(out, Request) and out.matcher is None and out.logit_adjustments() == []


def test_a_grammar_that_does_not_compile_is_an_error_frame_naming_it(constraints: Constraints) -> None:
    out = prepare(constrained(Constraint("gbnf", "root ::= nowhere", "grammar")), constraints.matcher)
    assert isinstance(out, Error)
    assert (out.id, out.code, out.param) == (7, "invalid_request", "grammar")


def test_without_a_compiler_a_constraint_is_unsupported() -> None:
    out = prepare(constrained(Constraint("gbnf", 'root ::= "a"', "grammar")), None)
    assert isinstance(out, Error) and out.code == "unsupported" and out.param == "grammar"


def test_gbnf_becomes_lark_before_the_tokenize_stage(constraints: Constraints) -> None:
    c = as_lark(Constraint("gbnf", 'root ::= "ab"', "grammar"))
    assert c.kind == "lark" and c.param == "grammar"
    m = constraints.matcher(c)
    assert allowed(m) == {tok("a")}
    other = Constraint("json_schema", "{}", "json_schema")
    assert as_lark(other) is other
    with pytest.raises(RequestRejected) as info:
        as_lark(Constraint("gbnf", "root ::= nowhere", "grammar"))
    assert info.value.param == "grammar"


def test_the_render_stage_hands_gbnf_over_as_lark(constraints: Constraints) -> None:
    seen: list[Constraint] = []

    def compile_(c: Constraint) -> Matcher:
        seen.append(c)
        return constraints.matcher(c)

    out = prepare(constrained(Constraint("gbnf", 'root ::= "a"', "grammar")), compile_)
    assert isinstance(out, Request)
    assert [c.kind for c in seen] == ["lark"]
    out = prepare(constrained(Constraint("gbnf", "root ::= (((", "grammar")), compile_)
    assert isinstance(out, Error) and out.param == "grammar"
