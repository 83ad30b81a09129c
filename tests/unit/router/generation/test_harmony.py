"""Issue 22, item 3: GPT-OSS's harmony messages (router/generation/harmony.py), with the
outputs of llama.cpp's tests/test-chat.cpp for its gpt_oss handler, whole and streamed in
random pieces, and its template's own call read back."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest

from router.generation.chat_output import ChatOutput
from router.generation.harmony import HarmonyParser
from router.generation.tool_grammar import tool_choice_grammar
from tests.unit.router.generation.test_tool_calls import splits
from worker.chat_formats import detect_tool_format
from worker.chat_template import JinjaTemplate
from worker.protocol import ChatMessage, ToolCall

TEMPLATE = Path(__file__).resolve().parents[3] / "fixtures" / "templates" / "openai-gpt-oss-120b.jinja"


def read(text: str, seed: int | None = None, tools: bool = True, cut: bool = False) -> ChatOutput:
    out = ChatOutput(tools="gpt_oss" if tools else None, reasoning=True, harmony=True)
    for chunk in [text] if seed is None else splits(text, seed):
        out.feed(chunk)
    out.finish(cut=cut)
    return out


CASES = [
    (  # test-chat.cpp: reasoning, then the final answer
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?",
        "I'm\nthinking", "Hello, world!\nWhat's up?", [],
    ),
    (  # test-chat.cpp: reasoning, then a call addressed in the channel's header
        "<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.edit <|constrain|>json<|message|>{"oldString": "a", "newString": "b"}',
        "Thinking about edit...", "", [("edit", {"oldString": "a", "newString": "b"})],
    ),
    (  # the layout its template writes: the recipient in the role's header, ended by <|call|>
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        "", "", [("get_weather", {"city": "Paris"})],
    ),
    (  # a preamble on commentary is content; a built-in tool's call is dropped
        "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>commentary to=python "
        "<|constrain|>code<|message|>print(1)<|end|><|start|>assistant<|channel|>final<|message|>Done.",
        "", "Let me look.Done.", [],
    ),
    ("No header at all.", "", "No header at all.", []),
]


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), CASES)
@pytest.mark.parametrize("seed", [None, *range(12)])
def test_harmony_messages_split_into_reasoning_content_and_calls(
    text: str, reasoning: str, content: str, calls: list[tuple[str, object]], seed: int | None
) -> None:
    out = read(text, seed)
    assert out.reasoning_text == reasoning and out.content == content
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == calls
    assert out.finish_reason("stop") == ("tool_calls" if calls else "stop")


def test_without_tools_a_call_is_text_and_a_cut_call_is_dropped() -> None:
    text = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}'
    assert read(text, tools=False).content == '{"a": 1}' and read(text, tools=False).calls == []
    cut = read(text[:-3], cut=True)
    assert cut.calls == [] and cut.content == ""
    p = HarmonyParser()
    assert p.feed("<|channel|>analysis<|message|>abc<|e") == ("abc", [])  # the end marker's start waits


def test_the_template_is_read_as_gpt_oss_and_its_call_parses_back() -> None:
    source = TEMPLATE.read_text(encoding="utf-8")
    assert detect_tool_format(source) == "gpt_oss"
    t = JinjaTemplate(source, "<|startoftext|>", "<|return|>")
    assert t.format.tools == "gpt_oss" and t.format.reasoning
    msgs = [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(
            role="assistant", content="", reasoning_content="Need the tool.",
            tool_calls=[ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}')],
        ),
        ChatMessage(role="tool", content="21", tool_call_id="c1"),
    ]
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}}
    text = t.render(msgs, tools=[weather])
    assert "<|channel|>analysis<|message|>Need the tool.<|end|>" in text  # reasoning as `thinking`
    after = text[text.index("Weather in Paris?<|end|>") + len("Weather in Paris?<|end|>") :]
    out = read(after)
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == [("get_weather", {"city": "Paris"})]
    assert text.endswith("<|start|>assistant")  # the generation prompt the output continues


def test_the_forced_grammar_writes_harmonys_call() -> None:
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    grammar = tool_choice_grammar("gpt_oss", [weather], parallel=True)
    assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", grammar)) == ""
    assert '"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"' in grammar
