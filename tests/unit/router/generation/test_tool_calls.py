"""Tool calls and reasoning found in model output, whole and streamed in random splits;
the Lark grammars of a forced call compile with llguidance; the response shapes validate
under the openai client's strict models."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import llguidance
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from router.api.openai import render as openai_render
from router.api.openai.shapes import Completion
from router.api.openai.shapes import message as openai_message
from router.generation.answer import Answer
from router.generation.chat_output import ChatOutput
from router.generation.events import (
    Begin, Delta, Done, Event, Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart,
)
from router.generation.job import GenerationJob
from router.generation.reasoning import ReasoningSplitter
from router.generation.calls import Call
from router.generation.tool_calls import Piece, ToolCallParser
from router.generation.tool_grammar import tool_choice_grammar
from worker.chat_template import JinjaTemplate
from worker.protocol import ChatMessage, SamplingParams, ToolCall, ToolFormat, Usage

TEMPLATES = Path(__file__).resolve().parents[3] / "fixtures" / "templates"
PARIS = Call(name="get_weather", arguments='{"city": "Paris"}')


def message(out: ChatOutput, deltas: list[Delta]) -> dict[str, Any]:
    """The OpenAI `message` of a whole reply whose deltas these are."""
    answer = Answer()
    for d in deltas:
        answer.add(d)
    answer.add(Finish(0, out.finish_reason("stop"), Usage(prompt_tokens=0, completion_tokens=0)))
    return openai_message(answer.ordered()[0])


async def openai_deltas(deltas: list[Delta]) -> list[dict[str, Any]]:
    """The `delta` objects of the OpenAI chunks these deltas stream as."""
    job = GenerationJob(model="m", params=SamplingParams(), messages=(), stream=True)

    async def events() -> Any:
        for d in deltas:
            yield d

    out = []
    async for chunk in openai_render.chunks(events(), Completion("m", chat=True), job):
        out.append(json.loads(chunk.split(b"data: ", 1)[1])["choices"][0]["delta"])
    return out


def splits(text: str, seed: int) -> list[str]:
    """`text` cut at random places, as a stream delivers it."""
    rnd = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        j = min(len(text), i + rnd.randint(1, 6))
        out.append(text[i:j])
        i = j
    return out


def merged(pieces: list[Piece]) -> list[Piece]:
    """Adjacent content pieces joined, so a stream and a whole parse compare equal."""
    out: list[Piece] = []
    for p in pieces:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif p != "":
            out.append(p)
    return out


def parse(fmt: ToolFormat, chunks: list[str]) -> list[Piece]:
    p = ToolCallParser(fmt)
    out: list[Piece] = []
    for c in chunks:
        out += p.feed(c)
    return merged(out + p.finish())


def check(fmt: ToolFormat, text: str, expected: list[Piece]) -> None:
    assert parse(fmt, [text]) == expected
    for seed in range(40):
        assert parse(fmt, splits(text, seed)) == expected, seed


# ---- each format, as its models write calls -------------------------------------------------

CASES: list[tuple[ToolFormat, str, list[Piece]]] = [
    (
        "hermes",
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        ["Let me look.\n", PARIS, Call(name="f", arguments="{}")],
    ),
    ("hermes", "a < b and <tool is not a call", ["a < b and <tool is not a call"]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', [PARIS]),  # unclosed at EOS
    ("hermes", "<tool_call>not json</tool_call> after", ["<tool_call>not json</tool_call> after"]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', [PARIS]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', [PARIS]),
    ("llama3", '{"answer": 42}', ['{"answer": 42}']),
    ("llama3", "Paris is sunny {today}.", ["Paris is sunny {today}."]),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}, '
        '{"name": "f", "arguments": {"s": "]}"}}]',
        [Call(name="get_weather", arguments='{"city": "Paris"}', id="abcDEF123"), Call(name="f", arguments='{"s": "]}"}')],
    ),
    ("mistral", "Just text [TOOL", ["Just text [TOOL"]),
    ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}', [PARIS]),
    ("generic", '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', [PARIS]),
    ("generic", '{"response": "It is sunny."}', ["It is sunny."]),
    ("generic", "Plain answer", ["Plain answer"]),
    ("generic", '{"tool_calls": [{"name": "get_weather", "argu', ['{"tool_calls": [{"name": "get_weather", "argu']),
]


@pytest.mark.parametrize(("fmt", "text", "expected"), CASES)
def test_calls_found_whole_and_in_random_splits(fmt: ToolFormat, text: str, expected: list[Piece]) -> None:
    check(fmt, text, expected)


def test_content_is_not_held_back_longer_than_a_marker_start() -> None:
    p = ToolCallParser("hermes")
    assert p.feed("Hello wor") == ["Hello wor"]
    assert p.feed("ld <tool") == ["ld "]  # "<tool" may become <tool_call>
    assert p.feed("s are fun") == ["<tools are fun"]


# ---- round trip: what a template writes as a call, the parser reads as that call -------------


def _history_call(name: str) -> str:
    """The text of the assistant's call as the template renders it in the history."""
    t = JinjaTemplate((TEMPLATES / name).read_text(encoding="utf-8"), "<s>", "</s>")
    msgs = [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(role="assistant", content="", tool_calls=[ToolCall(id="abc123XYZ", name="get_weather", arguments='{"city": "Paris"}')]),
        ChatMessage(role="tool", content="21", tool_call_id="abc123XYZ"),
    ]
    return t.render(msgs, tools=[{"type": "function", "function": {"name": "get_weather"}}])


@pytest.mark.parametrize(
    ("name", "fmt", "pattern"),
    [
        ("Qwen-Qwen3-0.6B.jinja", "hermes", r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>"),
        ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3", r"assistant<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>"),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral", r"(\[TOOL_CALLS\].*?)</s>"),
        ("google-gemma-2-2b-it.jinja", "generic", r"<start_of_turn>model\n(.*?)<end_of_turn>"),
    ],
)
def test_calls_as_templates_write_them_parse_back(name: str, fmt: ToolFormat, pattern: str) -> None:
    m = re.search(pattern, _history_call(name), re.S)
    assert m is not None
    calls = [p for p in parse(fmt, [m.group(1)]) if isinstance(p, Call)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    for seed in range(20):
        assert [p for p in parse(fmt, splits(m.group(1), seed)) if isinstance(p, Call)] == calls


# ---- reasoning ----------------------------------------------------------------------------------


def split_reasoning(chunks: list[str], in_reasoning: bool = False) -> tuple[str, str]:
    s = ReasoningSplitter(in_reasoning)
    r, c = "", ""
    for chunk in chunks:
        a, b = s.feed(chunk)
        r, c = r + a, c + b
    a, b = s.finish()
    return r + a, c + b


@pytest.mark.parametrize(
    ("text", "in_reasoning", "expected"),
    [
        ("<think>\nThe user wants 4.\n</think>\n\nIt is 4.", False, ("The user wants 4.", "It is 4.")),
        ("The user wants 4.\n</think>\n\nIt is 4.", True, ("The user wants 4.", "It is 4.")),
        ("It is 4. <think>not reasoning</think>", False, ("", "It is 4. <think>not reasoning</think>")),
        ("<think>\nstill thinking when cut", False, ("still thinking when cut", "")),
        ("  <thin", False, ("", "  <thin")),
        ("<think></think>Answer", False, ("", "Answer")),
    ],
)
def test_reasoning_split_whole_and_streamed(text: str, in_reasoning: bool, expected: tuple[str, str]) -> None:
    assert split_reasoning([text], in_reasoning) == expected
    for seed in range(40):
        assert split_reasoning(splits(text, seed), in_reasoning) == expected, seed


async def test_reasoning_then_a_call() -> None:
    out = ChatOutput(tools="hermes", reasoning=True, in_reasoning=True)
    deltas: list[Delta] = []
    for chunk in splits('I should call it.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', 3):
        deltas += out.feed(chunk)
    deltas += out.finish()
    assert "".join(d.text for d in deltas if isinstance(d, ReasoningDelta)) == "I should call it."
    assert not any(isinstance(d, TextDelta) for d in deltas)
    start, args, end = [d for d in deltas if isinstance(d, (ToolCallStart, ToolCallDelta, ToolCallEnd))]
    assert isinstance(start, ToolCallStart) and start.call == 0 and start.id.startswith("call_")
    assert start.name == "get_weather"
    assert args == ToolCallDelta(0, 0, '{"city": "Paris"}') and end == ToolCallEnd(0, 0)
    # OpenAI's streaming shape: the id, type and name first, then the arguments.
    first, second = [d["tool_calls"][0] for d in await openai_deltas(deltas) if "tool_calls" in d]
    assert first["index"] == 0 and first["id"] == start.id and first["type"] == "function"
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    assert second == {"index": 0, "function": {"arguments": '{"city": "Paris"}'}}
    msg = message(out, deltas)
    assert msg["content"] is None and msg["reasoning_content"] == "I should call it."
    assert msg["tool_calls"][0]["function"]["name"] == "get_weather"
    assert out.finish_reason("stop") == "tool_calls"


def test_a_call_inside_reasoning_is_not_made() -> None:
    out = ChatOutput(tools="hermes", reasoning=True)
    out.feed('<think><tool_call>{"name": "x", "arguments": {}}</tool_call></think>Fine.')
    out.finish()
    assert out.calls == [] and out.content == "Fine." and out.finish_reason("stop") == "stop"


def test_mistral_calls_keep_nine_character_ids() -> None:
    out = ChatOutput(tools="mistral", reasoning=False)
    out.feed('[TOOL_CALLS][{"name": "a", "arguments": {}, "id": "abcDEF123"}, {"name": "b", "arguments": {}}]')
    out.finish()
    assert out.calls[0].id == "abcDEF123"
    assert len(out.calls[1].id) == 9 and out.calls[1].id.isalnum()


# ---- the response shapes under the openai client's strict models -------------------------------


async def test_whole_response_and_chunks_validate_strictly() -> None:
    fmt = Completion(model="m", chat=True)
    out = ChatOutput(tools="generic", reasoning=True)
    deltas = out.feed('<think>hmm</think>{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}')
    deltas += out.finish()
    usage = Usage(prompt_tokens=3, completion_tokens=5)
    events: list[Event] = [Begin(0), *deltas, Finish(0, out.finish_reason("stop"), usage), Done(usage)]
    job = GenerationJob(model="m", params=SamplingParams(), messages=(), stream=True, include_usage=True)

    async def play() -> Any:
        for ev in events:
            yield ev

    whole = json.loads(await openai_render.whole(play(), fmt, job))
    resp = ChatCompletion.model_validate(whole, strict=True)
    assert resp.choices[0].finish_reason == "tool_calls"
    assert resp.choices[0].message.reasoning_content == "hmm"  # type: ignore[attr-defined]
    call = resp.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    chunks = [c async for c in openai_render.chunks(play(), fmt, job)]
    assert chunks[-1] == b"data: [DONE]\n\n"
    for event in chunks[:-1]:
        chunk = ChatCompletionChunk.model_validate(json.loads(event.split(b"data: ", 1)[1]), strict=True)
        assert chunk.choices == [] or chunk.choices[0].delta is not None


# ---- grammars of a forced call --------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "now"}},  # no parameters: any object
]


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral", "generic"])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("tools", [TOOLS, TOOLS[:1]], ids=["two", "one"])
def test_forced_call_grammars_compile(fmt: ToolFormat, parallel: bool, tools: list[dict[str, Any]]) -> None:
    src = tool_choice_grammar(fmt, tools, parallel)
    assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", src)) == ""


def test_a_broken_grammar_does_not_validate() -> None:
    # The check above can fail: a grammar with a bad embedded schema is refused.
    src = tool_choice_grammar("hermes", TOOLS[:1], False).replace('"type": "string"', '"type": 7')
    assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", src)) != ""


# ---- issue 20: cut calls, repeats, undeclared functions, calls one by one --------------------

WEATHER_C = Call(name="get_weather", arguments='{"city": "Paris", "unit": "c"}')
WEATHER_F = Call(name="get_weather", arguments='{"city": "Paris", "unit": "f"}')
GENERIC_LOOP = (
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, '
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "f"}}, '
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, '
    '{"name": "get_weather", "arguments": {"city": "Par'
)


def test_an_array_of_calls_comes_out_call_by_call() -> None:
    p = ToolCallParser("generic")
    assert p.feed('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}') == [WEATHER_C]
    assert p.feed(', {"name": "get_weather", "arguments": {"city": "Paris", "unit": "f"}}') == [WEATHER_F]
    assert p.feed("]}") == [] and p.finish() == []
    p = ToolCallParser("mistral")
    assert p.feed('[TOOL_CALLS][{"name": "f", "arguments": {}}') == [Call(name="f", arguments="{}")]


@pytest.mark.parametrize("fmt", ["generic", "mistral", "hermes", "llama3"])
def test_a_call_cut_short_is_dropped_and_the_whole_ones_stand(fmt: ToolFormat) -> None:
    """On 8ad3c96 a forced answer cut by max_tokens came back as content, its calls lost."""
    texts = {
        "generic": '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, {"name": "get_w',
        "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, {"name": "get_w',
        "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>\n<tool_call>\n{"na',
        "llama3": '{"name": "get_weather", "parameters": {"city": "Par',
    }
    for seed in range(20):
        p = ToolCallParser(fmt)
        pieces: list[Piece] = []
        for chunk in splits(texts[fmt], seed):
            pieces += p.feed(chunk)
        pieces += p.finish(cut=True)
        assert merged(pieces) == ([] if fmt == "llama3" else [WEATHER_C]), (fmt, seed)


def test_a_reply_whose_calls_repeat_ends_at_the_first_repeat() -> None:
    out = ChatOutput(tools="generic", reasoning=False, declared={"get_weather"})
    deltas: list[Delta] = []
    for chunk in splits(GENERIC_LOOP, 5):
        deltas += out.feed(chunk)
    assert out.ended
    assert out.feed('is"}}]}') == [] and out.finish(cut=True) == []
    assert [(c.name, c.arguments) for c in out.calls] == [(WEATHER_C.name, WEATHER_C.arguments), (WEATHER_F.name, WEATHER_F.arguments)]
    assert out.finish_reason("cancelled") == "tool_calls" and message(out, deltas)["content"] is None
    assert not any(isinstance(d, TextDelta) for d in deltas)
    # Same arguments in another order or spacing are the same call.
    out = ChatOutput(tools="generic", reasoning=False)
    out.feed('{"tool_calls": [{"name": "f", "arguments": {"a": 1, "b": 2}}, {"name": "f", "arguments": {"b":2,"a":1}}')
    assert out.ended and len(out.calls) == 1


def test_with_none_whole_a_cut_forced_answer_is_length_and_no_content() -> None:
    out = ChatOutput(tools="generic", reasoning=False, declared={"get_weather"})
    out.feed('{"tool_calls": [{"name": "get_weather", "argu')
    out.finish(cut=True)
    assert out.calls == [] and out.content == "" and out.finish_reason("length") == "length"


def test_a_call_to_an_undeclared_function_is_content() -> None:
    out = ChatOutput(tools="hermes", reasoning=False, declared={"get_weather"})
    text = (
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
    )
    out.feed(text)
    out.finish()
    assert [c.name for c in out.calls] == ["get_weather"]
    assert out.content == '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    out = ChatOutput(tools="generic", reasoning=False, declared={"get_weather"})
    out.feed('{"tool_calls": [{"name": "rm_rf", "arguments": {}}]}')
    out.finish()
    assert out.calls == [] and out.content == '{"name": "rm_rf", "arguments": {}}'
    assert out.finish_reason("stop") == "stop"


@pytest.mark.parametrize("fmt", ["hermes", "mistral", "generic"])
def test_a_forced_answer_holds_at_most_sixteen_parallel_calls(fmt: ToolFormat) -> None:
    from router.generation.tool_grammar import MAX_PARALLEL_CALLS

    grammar = llguidance.grammar_from("lark", tool_choice_grammar(fmt, TOOLS[1:], True))
    tok = llguidance.LLTokenizer("byte")
    one = {"hermes": '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>', "mistral": '{"name": "now", "arguments": {}}',
           "generic": '{"name": "now", "arguments": {}}'}[fmt]
    sep = {"hermes": "\n", "mistral": ", ", "generic": ", "}[fmt]

    def accepts(n: int) -> bool:
        body = sep.join([one] * n)
        text = {"hermes": body, "mistral": f"[TOOL_CALLS][{body}]", "generic": f'{{"tool_calls": [{body}]}}'}[fmt]
        m = llguidance.LLMatcher(tok, grammar, log_level=0)
        return bool(m.consume_tokens(tok.tokenize_str(text))) and not m.is_error() and m.is_accepting()

    assert accepts(1) and accepts(MAX_PARALLEL_CALLS) and not accepts(MAX_PARALLEL_CALLS + 1)
