"""The pure parts of llama-server's API (issue 10, item 6): request conversion, the mixed
prompt in the worker's preparing stage, response and error shapes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from router.api.llama.errors import render as render_native
from router.api.llama.errors import render_http
from router.api.timings import timings_json
from router.generation.events import Finish
from router.api.llama.render import NativeCompletion, pick_fields
from router.api.llama.schemas import NativeCompletionRequest
from router.api.llama.translate import completion_job, native_params, native_prompts
from supervisor import errors as e
from tests.unit.worker.test_prompts import FakeModel, prepare
from worker.prompts import detokenize_texts, piece
from worker.text_limits import Limit
from worker.protocol import Constraint, Detokenize, Generate, SamplingParams, Timings, Usage
from worker.rejected import RequestRejected
from worker.request import Request
from worker.stops import StopMatcher


def req(**body: Any) -> NativeCompletionRequest:
    r: NativeCompletionRequest = msgspec.json.decode(msgspec.json.encode({"prompt": "x", **body}), type=NativeCompletionRequest)
    return r


# ---- requests ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [  # llama.cpp's test_completion.py test_completion_with_tokens_input and test_json_prompt_no_mtmd
        ("hi", ["hi"]),
        (["hi"], ["hi"]),
        ([[1, 2]], [(1, 2)]),
        ([1, "a", 2], [(1, "a", 2)]),
        ([["a", 3]], [("a", 3)]),
        ({"prompt_string": "a"}, ["a"]),
        # several prompts, each answered on its own
        (["a", "b"], ["a", "b"]),
        ([[1], [2]], [(1,), (2,)]),
        ([[1, 2], {"prompt_string": "a"}], [(1, 2), "a"]),
    ],
)
def test_prompts_in_any_of_llama_servers_forms(prompt: Any, expected: Any) -> None:
    assert native_prompts(req(prompt=prompt)) == expected


@pytest.mark.parametrize(
    ("prompt", "error", "param"),
    [
        ([1, 2.5], e.InvalidRequest, "prompt"),
        ([True], e.InvalidRequest, "prompt[0]"),
        ([], e.InvalidRequest, "prompt"),
        ([2**40], e.InvalidRequest, "prompt"),
        ({"prompt_string": "a", "multimodal_data": ["x"]}, e.InvalidRequest, "prompt"),  # test_json_prompt_mtm_error_when_not_supported
    ],
)
def test_prompts_that_are_refused(prompt: Any, error: type[e.CorralError], param: str) -> None:
    with pytest.raises(error) as info:
        native_prompts(req(prompt=prompt))
    assert info.value.param == param


def test_n_probs_asks_for_that_many_candidates_and_post_sampling_is_refused_by_name() -> None:
    """llama.cpp's test_completion.py test_n_probs: n_probs 10 gives each token and its 10
    likeliest. post_sampling_probs would need the sampler chain's distribution, which
    Corral does not read: a 400 naming it, never the model's numbers under its name."""
    assert native_params(req(n_probs=10)).logprobs == 10
    assert native_params(req()).logprobs is None
    for bad in (-1, 101):
        with pytest.raises(e.InvalidRequest) as info:
            native_params(req(n_probs=bad))
        assert info.value.param == "n_probs"
    with pytest.raises(e.Unsupported) as unsupported:
        native_params(req(n_probs=3, post_sampling_probs=True))
    assert unsupported.value.param == "post_sampling_probs"


def test_n_predict_and_max_tokens() -> None:
    assert native_params(req()).max_tokens is None  # -1 (llama-server's default): no limit
    assert native_params(req(n_predict=-1)).max_tokens is None
    assert native_params(req(n_predict=0)).max_tokens == 0  # prefill only
    assert native_params(req(n_predict=5)).max_tokens == 5
    assert native_params(req(n_predict=5, max_tokens=7)).max_tokens == 7
    with pytest.raises(e.InvalidRequest) as info:
        native_params(req(n_predict=-2))
    assert info.value.param == "n_predict"


@pytest.mark.parametrize(
    ("field", "value"),
    [("mirostat", 2), ("typical_p", 0.5), ("dry_multiplier", 0.8), ("xtc_probability", 0.5),
     ("dynatemp_range", 0.5)],
)
def test_what_corral_cannot_do_is_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(e.Unsupported) as info:
        native_params(req(**{field: value}))
    assert info.value.param == field


def test_lora_becomes_the_jobs_adapter_scales_and_a_bad_entry_is_a_400_naming_it() -> None:
    """llama-server's per-request `lora` (server-schema.cpp): an array of {id, scale},
    scale defaulting to 0; an empty one leaves the model's scales (construct_lora_list
    runs only for a non-empty list)."""
    job = completion_job(req(prompt="hi", lora=[{"id": 1, "scale": 0.5}, {"id": 0}]), "m", SamplingParams())
    assert job.lora == ((1, 0.5), (0, 0.0))
    assert completion_job(req(prompt="hi", lora=[]), "m", SamplingParams()).lora is None
    for bad in ([{"id": "0", "scale": 1}], [{"id": 0, "scale": float("nan")}], [3], [{"id": 0, "x": 1}]):
        with pytest.raises(e.InvalidRequest) as info:
            completion_job(req(prompt="hi", lora=bad), "m", SamplingParams())
        assert info.value.param == "lora"


def test_grammar_and_json_schema_become_the_constraint() -> None:
    assert native_params(req(grammar='root ::= "a"')).constraint == Constraint(
        kind="gbnf", source='root ::= "a"', param="grammar"
    )
    c = native_params(req(json_schema={"type": "object"})).constraint
    assert c is not None and (c.kind, c.param) == ("json_schema", "json_schema")
    with pytest.raises(e.InvalidRequest) as info:  # one constraint per request
        native_params(req(grammar='root ::= "a"', json_schema={"type": "object"}))
    assert info.value.param == "grammar"


def test_accepted_and_ignored_parameters() -> None:
    p = native_params(req(cache_prompt=False, id_slot=2, samplers=["top_k"], n_keep=-1, mirostat=0,
                          timings_per_token=True, seed=-1, top_k=5, min_p=0.2, repeat_penalty=1.1))
    assert p.timings_per_token and p.top_k == 5 and p.min_p == 0.2 and p.repeat_penalty == 1.1 and p.seed == -1
    with pytest.raises(e.InvalidRequest):
        native_params(req(seed=2**33))


# ---- the worker's preparing stage -------------------------------------------------------------


class VocabFake(FakeModel):
    n_vocab = 300

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(chr(t) for t in tokens)

    def token_text(self, token: int) -> bytes:
        return bytes([token])


def mixed(parts: list[int | str], n_ctx_slot: int = 64) -> Request:
    r = prepare(Generate(id=1, params=SamplingParams(), prompt_parts=parts), VocabFake(), n_ctx_slot)  # type: ignore[arg-type]
    assert isinstance(r, Request)
    return r


def test_a_mixed_prompt_tokenizes_its_strings_in_place_bos_only_first() -> None:
    assert mixed([2, "ab", 3]).prompt == [2, 97, 98, 3]
    assert mixed(["ab", 3]).prompt == [2, 97, 98, 3]  # the fake's BOS is 2
    assert mixed([5, 6]).prompt == [5, 6]


@pytest.mark.parametrize("bad", [-1, 300, 2**31 - 1])
def test_a_token_id_outside_the_vocabulary_is_refused(bad: int) -> None:
    with pytest.raises(RequestRejected) as info:
        mixed([2, bad])
    assert info.value.code == "invalid_request" and info.value.param == "prompt"
    assert "prompt[1]" in info.value.message


def test_a_mixed_prompt_over_the_context_reports_its_counts() -> None:
    with pytest.raises(RequestRejected) as info:
        mixed([1] * 10 + ["abcdef"], n_ctx_slot=12)
    rej = info.value
    assert rej.code == "context_length_exceeded" and (rej.n_prompt_tokens, rej.n_ctx) == (16, 12)


def test_a_refusal_by_length_reports_the_lower_bound() -> None:
    rej = Limit(10, "the prompt", "why", "prompt", n_ctx=11).refuse(40, at_least=True)
    assert (rej.n_prompt_tokens, rej.n_ctx) == (40, 11) and "at least 40 tokens" in rej.message


def test_detokenize_checks_ids_first() -> None:
    with pytest.raises(RequestRejected) as info:
        detokenize_texts(Detokenize(id=1, tokens=[1, 300]), VocabFake())
    assert info.value.param == "tokens"
    assert detokenize_texts(Detokenize(id=1, tokens=[104, 105]), VocabFake()).tokenize(VocabFake()).content == "hi"  # type: ignore[union-attr]


def test_a_piece_that_is_not_utf8_is_its_bytes() -> None:
    assert piece("é".encode()) == "é"
    assert piece(b"\xf0\xa0") == [0xF0, 0xA0]


def test_the_stop_matcher_says_which_string_matched() -> None:
    m = StopMatcher(("END", "\n\n"))
    assert m.feed("abc\n") == ("abc", False)
    assert m.feed("\nEND") == ("", True)  # the earliest match wins: "\n\n", not "END"
    assert m.matched == "\n\n"


# ---- answers and errors -----------------------------------------------------------------------


def test_timings_are_derived_from_the_workers_counts() -> None:
    t = timings_json(Timings(prompt_n=10, prompt_ms=20.0, predicted_n=4, predicted_ms=100.0, cache_n=3))
    assert t["prompt_per_token_ms"] == 2.0 and t["prompt_per_second"] == 500.0
    assert t["predicted_per_token_ms"] == 25.0 and t["predicted_per_second"] == 40.0 and t["cache_n"] == 3
    zero = timings_json(Timings(prompt_n=0, prompt_ms=0.0, predicted_n=0, predicted_ms=0.0))
    assert zero["prompt_per_second"] == 0.0 and zero["predicted_per_token_ms"] == 0.0


def test_the_final_answer_says_why_it_stopped() -> None:
    fmt = NativeCompletion(model="m", params=SamplingParams(max_tokens=4), n_ctx=8)
    last = Finish(0, "length", Usage(prompt_tokens=4, completion_tokens=4), stop_type="limit")
    out = fmt.final("abcd", [1, 2, 3, 4], last, "p")
    assert out["stop_type"] == "limit" and out["truncated"] is True  # prompt + output filled n_ctx
    assert out["tokens"] == []  # return_tokens not asked, not streamed
    word = Finish(0, "stop", Usage(prompt_tokens=1, completion_tokens=1), stop_type="word", stopping_word="\n")
    out = fmt.final("a", [1], word, "p")
    assert (out["stop_type"], out["stopping_word"], out["truncated"]) == ("word", "\n", False)
    assert out["generation_settings"]["n_predict"] == 4 and out["generation_settings"]["seed"] == 0xFFFFFFFF


def test_a_context_overflow_is_exceed_context_size_error_with_counts() -> None:
    body, status, _ = render_native(e.ContextOverflow("too long", "prompt", n_prompt_tokens=5000, n_ctx=2048))
    assert status == 400
    assert msgspec.json.decode(body) == {"error": {
        "code": 400, "message": "too long", "type": "exceed_context_size_error", "param": "prompt",
        "n_prompt_tokens": 5000, "n_ctx": 2048,
    }}


@pytest.mark.parametrize(
    ("exc", "status", "type_"),
    [
        (e.InvalidRequest("bad", "x"), 400, "invalid_request_error"),
        (e.Unsupported("no", "mirostat"), 400, "invalid_request_error"),
        (e.ModelNotFound("none", "model"), 404, "not_found_error"),
        (e.WorkerUnavailable("later"), 503, "unavailable_error"),
        (e.InternalError("bug"), 500, "server_error"),
    ],
)
def test_native_error_types(exc: e.CorralError, status: int, type_: str) -> None:
    body, got, headers = render_native(exc)
    err = msgspec.json.decode(body)["error"]
    assert (got, err["code"], err["type"]) == (status, status, type_)
    if isinstance(exc, e.WorkerUnavailable):
        assert headers["x-should-retry"] == "true"


def test_an_http_error_is_in_llama_servers_shape() -> None:
    body, status, _ = render_http(405, "Method GET is not allowed on /completion", "method_not_allowed")
    assert status == 405
    assert msgspec.json.decode(body) == {"error": {
        "code": 405, "message": "Method GET is not allowed on /completion", "type": "invalid_request_error"}}


def test_response_fields_pick_and_unnest() -> None:
    obj = {"content": "x", "generation_settings": {"n_predict": 3}, "stop": True}
    assert pick_fields(obj, ["content", "generation_settings/n_predict", "missing", "content/x"]) == {
        "content": "x", "n_predict": 3,
    }
