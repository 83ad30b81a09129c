"""worker/prompts.py: a text that cannot fit is refused before it is tokenized (issue 8,
finding 3), and one that can is tokenized and checked exactly."""

from __future__ import annotations

from typing import Any, Sequence

import pytest

from worker.chat_formats import ChatFormat
from worker.chat_template import ChatTemplate, TemplateError, TemplateTooLong
from worker.prompts import pooling_problem, texts_for
from worker.text_limits import Limit, Prepared
from worker.protocol import ChatMessage, Embed, Generate, SamplingParams, Tokenize, TokenizeResult, fewest_tokens
from worker.rejected import RequestRejected
from worker.request import EmbedJob, Request


class FakeModel:
    """One token per byte: the most tokens a text can make. Counts its calls, so a test
    can say what was never tokenized."""

    def __init__(self, max_token_bytes: int | None = 48, template: ChatTemplate | None = None) -> None:
        self._bound = max_token_bytes
        self.template = template
        self.tokenized: list[int] = []  # byte lengths of the texts tokenized
        self.bound_asked = 0

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode()
        self.tokenized.append(len(data))
        return ([2] if add_special else []) + list(data)

    def max_token_bytes(self) -> int | None:
        self.bound_asked += 1
        return self._bound


class Template:
    format = ChatFormat(tools=None, reasoning=False)

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.max_bytes: list[int | None] = []

    def render(
        self,
        messages: Sequence[ChatMessage],
        max_bytes: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        self.max_bytes.append(max_bytes)
        if self.fail:
            raise TemplateError("roles must alternate")
        text = "".join(f"<{m.role}>{m.content}" for m in messages)
        if max_bytes is not None and len(text.encode()) > max_bytes:
            raise TemplateTooLong(len(text.encode()))
        return text


def prepare(frame: Generate | Embed | Tokenize, m: FakeModel, n_ctx_slot: int = 4096, n_batch: int = 512) -> Prepared:
    """Both stages, as the preparing threads run them."""
    return texts_for(frame, m, n_ctx_slot, n_batch).tokenize(m)


def new_request(g: Generate, m: FakeModel, n_ctx_slot: int) -> Request:
    r = prepare(g, m, n_ctx_slot)
    assert isinstance(r, Request)
    return r


def tokens_within(m: FakeModel, text: str, most: int) -> list[list[int]]:
    g = Generate(id=1, params=SamplingParams(), prompt=text)
    r = prepare(g, m, n_ctx_slot=most + 1)
    assert isinstance(r, Request)
    return [r.prompt]


def gen(prompt: str | None = None, messages: list[ChatMessage] | None = None, **params: object) -> Generate:
    return Generate(id=7, params=SamplingParams(**params), prompt=prompt, messages=messages)  # type: ignore[arg-type]


def test_fewest_tokens_is_the_ceiling_of_bytes_over_the_longest_token() -> None:
    assert fewest_tokens(0, 48) == 0
    assert fewest_tokens(1, 48) == 1
    assert fewest_tokens(48, 48) == 1
    assert fewest_tokens(49, 48) == 2
    assert fewest_tokens(10**6, None) == 0  # no bound known: no claim


def test_a_text_that_cannot_fit_is_refused_without_tokenizing() -> None:
    m = FakeModel(max_token_bytes=48)
    with pytest.raises(RequestRejected) as info:
        new_request(gen(prompt="x" * 15_000_000), m, n_ctx_slot=4096)
    assert m.tokenized == []  # the 15 MB text never reached the tokenizer
    rej = info.value
    assert rej.code == "context_length_exceeded" and rej.param == "prompt"
    assert "at least 312500 tokens" in rej.message and "holds 4096 tokens" in rej.message


def test_the_bound_refuses_only_what_certainly_does_not_fit() -> None:
    m = FakeModel(max_token_bytes=4)
    # 4 * 4095 bytes could still be 4095 tokens: tokenized, and then refused by count.
    with pytest.raises(RequestRejected) as info:
        tokens_within(m, "x" * (4 * 4095), 4095)
    assert m.tokenized == [4 * 4095]
    assert "is 16381 tokens" in info.value.message
    # One more token's worth of bytes cannot fit at all.
    with pytest.raises(RequestRejected):
        tokens_within(m, "x" * (4 * 4095 + 1), 4095)
    assert m.tokenized == [4 * 4095]


def test_limits_refuse_by_bytes_with_a_lower_bound() -> None:
    limit = Limit(10, "the prompt", "why", "prompt")
    limit.check_bytes(480, 48)  # could be exactly 10 tokens
    with pytest.raises(RequestRejected) as info:
        limit.check_bytes(481, 48)
    assert info.value.message == "the prompt is at least 11 tokens; why"
    limit.check_bytes(10**9, None)  # no bound: no refusal


def test_short_texts_never_ask_for_the_bound() -> None:
    """Each token covers at least one byte, so a text shorter than the limit in bytes needs
    no bound; computing it costs a pass over the vocabulary."""
    m = FakeModel()
    r = new_request(gen(prompt="hello"), m, n_ctx_slot=4096)
    assert m.bound_asked == 0
    assert r.prompt == [2, *b"hello"] and r.max_new == 4096 - 6


def test_without_a_bound_a_long_text_is_tokenized_and_counted() -> None:
    m = FakeModel(max_token_bytes=None)
    with pytest.raises(RequestRejected) as info:
        new_request(gen(prompt="y" * 5000), m, n_ctx_slot=4096)
    assert m.tokenized == [5000]
    assert info.value.code == "context_length_exceeded"


def test_the_rendered_chat_is_what_is_bounded() -> None:
    template = Template()
    m = FakeModel(template=template)
    r = new_request(gen(messages=[ChatMessage(role="user", content="hi")], max_tokens=5), m, 100)
    assert bytes(r.prompt[1:]) == b"<user>hi" and r.max_new == 5
    # The template is told the byte limit, and refuses a longer rendering itself.
    assert template.max_bytes == [99 * 48]
    with pytest.raises(RequestRejected) as info:
        new_request(gen(messages=[ChatMessage(role="user", content="z" * 10_000)]), m, 100)
    assert info.value.param == "messages" and info.value.code == "context_length_exceeded"
    assert "at least 209 tokens" in info.value.message
    assert m.tokenized == [8]  # the long chat was never tokenized


@pytest.mark.parametrize(
    "g, model, code, param",
    [
        (gen(messages=[ChatMessage(role="user", content="x")]), FakeModel(), "unsupported", "messages"),
        (
            gen(messages=[ChatMessage(role="user", content="x")]),
            FakeModel(template=Template(fail=True)),
            "invalid_request",
            "messages",
        ),
    ],
)
def test_chat_without_a_usable_template_is_refused(
    g: Generate, model: FakeModel, code: str, param: str
) -> None:
    with pytest.raises(RequestRejected) as info:
        new_request(g, model, 100)
    assert (info.value.code, info.value.param) == (code, param)


def test_an_empty_prompt_is_refused() -> None:
    class NoSpecials(FakeModel):
        def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
            return list(text.encode())

    with pytest.raises(RequestRejected) as info:
        new_request(gen(prompt=""), NoSpecials(), 100)
    assert (info.value.code, info.value.param) == ("invalid_request", "prompt")


def test_embedding_inputs_are_bounded_by_the_batch() -> None:
    m = FakeModel(max_token_bytes=48)
    job = prepare(Embed(id=3, inputs=["ab", "c"]), m, n_batch=512)
    assert isinstance(job, EmbedJob) and job.inputs == [[2, 97, 98], [2, 99]]
    with pytest.raises(RequestRejected) as info:
        prepare(Embed(id=3, inputs=["ok", "w" * 1_000_000]), m, n_batch=512)
    assert info.value.code == "context_length_exceeded" and info.value.param == "input"
    assert "input[1] is at least" in info.value.message
    assert m.tokenized == [2, 1]  # the first request's; the second was refused untokenized
    with pytest.raises(RequestRejected) as info:
        prepare(Embed(id=4, inputs=["ok", ""]), m)
    assert (info.value.code, info.value.param) == ("invalid_request", "input")


def test_truncated_embedding_inputs_keep_their_first_tokens() -> None:
    """Ollama's `truncate` (its default): a long input is cut at its end, and only the
    bytes that can hold the tokens kept are tokenized."""
    m = FakeModel(max_token_bytes=4)
    job = prepare(Embed(id=5, inputs=["ok", "w" * 1_000_000], truncate=True), m, n_batch=8)
    assert isinstance(job, EmbedJob)
    assert job.inputs == [[2, 111, 107], [2] + [119] * 7]
    assert m.tokenized == [2, 32]  # 8 tokens of at most 4 bytes: 32 bytes were read
    v = VocabModel()
    tokens = prepare(Embed(id=6, inputs=[], tokens=[list(range(1, 20))], truncate=True), v, n_batch=8)
    assert isinstance(tokens, EmbedJob) and tokens.inputs == [list(range(1, 9))]
    with pytest.raises(RequestRejected):  # the default is still to refuse
        prepare(Embed(id=7, inputs=[], tokens=[list(range(1, 20))]), v, n_batch=8)


def test_mixed_embedding_inputs_tokenize_their_texts_in_place() -> None:
    """llama-server's mixed inputs (test_embedding.py test_embedding_mixed_input): ids as
    sent, texts tokenized where they stand, BOS only for a text that comes first; each
    input bounded by the batch as a text is, with llama-server's "too large"."""
    v = VocabModel()
    job = prepare(Embed(id=8, inputs=[], parts=[["ab", 12, "c"], [12, 34], ["x"]]), v, n_batch=16)
    assert isinstance(job, EmbedJob)
    assert job.inputs == [[2, 97, 98, 12, 99], [12, 34], [2, 120]]
    with pytest.raises(RequestRejected) as info:
        prepare(Embed(id=9, inputs=[], parts=[["ok"], [5, 301]]), v, n_batch=16)
    assert info.value.param == "input"  # an id past the vocabulary
    with pytest.raises(RequestRejected) as info:
        prepare(Embed(id=10, inputs=[], parts=[[1, 2, "w" * 40]]), v, n_batch=16)
    assert info.value.code == "context_length_exceeded" and "too large" in info.value.message
    cut = prepare(Embed(id=11, inputs=[], parts=[[1, 2, "w" * 40]], truncate=True), v, n_batch=16)
    assert isinstance(cut, EmbedJob) and cut.inputs == [[1, 2] + [119] * 14]


def test_tokenize_requests_are_bounded_by_the_context() -> None:
    m = FakeModel(max_token_bytes=48)
    for add_special, tokens in ((True, [2, 104, 105]), (False, [104, 105])):
        r = prepare(Tokenize(id=5, text="hi", add_special=add_special), m)
        assert isinstance(r, TokenizeResult) and r.tokens == tokens
    with pytest.raises(RequestRejected) as info:
        prepare(Tokenize(id=6, text="<start_of_turn>" * 100_000), m)
    assert info.value.param == "content" and m.tokenized == [2, 2]


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_pooled_embeddings_are_servable(pooling: str) -> None:
    assert pooling_problem(pooling) is None


@pytest.mark.parametrize("pooling, words", [("none", "per token"), ("rank", "reranker")])
def test_unpooled_or_rank_embeddings_say_why_they_are_refused(pooling: str, words: str) -> None:
    """Issue 8, finding 7 (request side): unpooled embeddings answered 500 "no pooled
    embedding"; now the refusal says why."""
    problem = pooling_problem(pooling)
    assert problem is not None and words in problem and "mean, cls or last" in problem


def test_per_token_embeddings_are_servable_on_the_native_route_only() -> None:
    """Issue 22, item 5: llama-server answers pooling "none" on /embedding with a vector
    per token, and refuses it on /v1/embeddings (test_embedding.py
    test_embedding_pooling_none, test_embedding_pooling_none_oai)."""
    assert pooling_problem("none", native=True) is None
    assert "not OAI compatible" in (pooling_problem("none") or "")
    assert pooling_problem("rank", native=True) is not None

class ThinkingTemplate(Template):
    """A template that opens a reasoning block in its generation prompt, as Qwen 3's and
    DeepSeek-R1's do, unless asked not to think."""

    format = ChatFormat(tools="hermes", reasoning=True)

    def render(
        self,
        messages: Sequence[ChatMessage],
        max_bytes: int | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        closed = (template_kwargs or {}).get("enable_thinking") is False
        return super().render(messages, max_bytes) + ("<think>\n\n</think>\n\n" if closed else "<think>\n")


def test_a_prompt_that_opens_reasoning_marks_the_request() -> None:
    m = FakeModel(template=ThinkingTemplate())
    msgs = [ChatMessage(role="user", content="hi")]
    assert new_request(Generate(id=1, params=SamplingParams(), messages=msgs), m, 4096).in_reasoning
    closed = Generate(id=2, params=SamplingParams(), messages=msgs, template_kwargs={"enable_thinking": False})
    assert not new_request(closed, m, 4096).in_reasoning
    assert not new_request(Generate(id=3, params=SamplingParams(), prompt="<think>\n"), m, 4096).in_reasoning


def test_tools_on_a_model_that_cannot_take_them_are_refused() -> None:
    g = Generate(id=1, params=SamplingParams(), messages=[ChatMessage(role="user", content="hi")], tools=[{"type": "function"}])
    with pytest.raises(RequestRejected) as info:
        prepare(g, FakeModel(template=Template()))
    assert info.value.param == "tools"


# ---- token prompts, logit_bias ids, n, echo (issue 10, item 4) -------------------------------


class VocabModel(FakeModel):
    n_vocab = 300

    def output_text(self, tokens: list[int]) -> str:
        return "".join(chr(t) for t in tokens if t >= 32)


def test_a_token_prompt_is_taken_as_sent_and_echoed_as_text() -> None:
    m = VocabModel()
    g = Generate(id=3, params=SamplingParams(), prompt_tokens=[2, 72, 105], echo=True, n=2)
    r = prepare(g, m)
    assert isinstance(r, Request)
    assert r.prompt == [2, 72, 105] and r.echo == "Hi" and r.n == 2
    assert m.tokenized == []  # nothing to tokenize


@pytest.mark.parametrize(
    ("frame", "param"),
    [
        (Generate(id=1, params=SamplingParams(), prompt_tokens=[5, 300]), "prompt"),
        (Generate(id=1, params=SamplingParams(), prompt_tokens=[-1]), "prompt"),
        (Generate(id=1, params=SamplingParams(), prompt_tokens=[]), "prompt"),
        (Generate(id=1, params=SamplingParams(logit_bias={300: 1.0}), prompt="x"), "logit_bias"),
        (Generate(id=1, params=SamplingParams(logit_bias={-2: 1.0}), prompt="x"), "logit_bias"),
        (Generate(id=1, params=SamplingParams(), prompt="x", n=0), "n"),
        (Embed(id=1, inputs=[], tokens=[[1, 300]]), "input"),
        (Embed(id=1, inputs=[], tokens=[[]]), "input"),
        (Embed(id=1, inputs=[], tokens=[]), "input"),
    ],
)
def test_ids_outside_the_vocabulary_are_refused_naming_the_parameter(frame: Generate | Embed, param: str) -> None:
    with pytest.raises(RequestRejected) as info:
        prepare(frame, VocabModel())
    assert info.value.param == param


def test_a_token_prompt_longer_than_the_context_is_refused() -> None:
    with pytest.raises(RequestRejected) as info:
        prepare(Generate(id=1, params=SamplingParams(), prompt_tokens=[5] * 10), VocabModel(), n_ctx_slot=10)
    assert info.value.code == "context_length_exceeded"


def test_token_inputs_embed_as_sent() -> None:
    job = prepare(Embed(id=4, inputs=[], tokens=[[1, 2], [3]]), VocabModel())
    assert isinstance(job, EmbedJob) and job.inputs == [[1, 2], [3]]


def test_siblings_share_the_prompt_with_their_own_seed_and_stop_matcher() -> None:
    g = Generate(id=5, params=SamplingParams(seed=10, stop=["x"]), prompt="hey", n=3, echo=True)
    r = prepare(g, VocabModel())
    assert isinstance(r, Request)
    sibs = r.siblings()
    assert [s.index for s in sibs] == [1, 2]
    assert [s.params.seed for s in sibs] == [11, 12]
    assert all(s.prompt == r.prompt and s.prompt is not r.prompt for s in sibs)
    assert all(s.stops is not r.stops and s.stops.stops == ("x",) for s in sibs)
    assert all(s.echo == "hey" for s in sibs)
    assert r.siblings() == []  # split once
    unseeded = prepare(Generate(id=6, params=SamplingParams(), prompt="a", n=2), VocabModel())
    assert isinstance(unseeded, Request) and unseeded.siblings()[0].params.seed is None
