"""Issue 22, item 3: Functionary v3.2's `>>>recipient` messages (router/generation/
functionary.py), with llama.cpp's tests/test-chat.cpp outputs for its functionary_v3_2
handler, whole and streamed in random pieces, and its template's own calls read back."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest

from router.generation.chat_output import ChatOutput
from router.generation.tool_grammar import tool_choice_grammar
from tests.unit.router.generation.test_tool_calls import splits
from worker.chat_formats import detect_tool_format
from worker.chat_template import JinjaTemplate
from worker.protocol import ChatMessage, ToolCall

TEMPLATE = Path(__file__).resolve().parents[3] / "fixtures" / "templates" / "meetkai-functionary-medium-v3.2.jinja"


def read(text: str, seed: int | None, tools: bool = True, cut: bool = False) -> ChatOutput:
    out = ChatOutput(tools="functionary_v3_2" if tools else None, reasoning=False, model_format="functionary_v3_2")
    for chunk in [text] if seed is None else splits(text, seed):
        out.feed(chunk)
    out.finish(cut=cut)
    return out


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("all\nHello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),  # test-chat.cpp
        ('special_function\n{"arg1": 1}', "", [("special_function", {"arg1": 1})]),  # test-chat.cpp
        (
            'all\nLet me look.>>>get_weather\n{"city": "Paris"}>>>now\n{}',
            "Let me look.", [("get_weather", {"city": "Paris"}), ("now", {})],
        ),
        ("A plain answer, no recipient at all.", "A plain answer, no recipient at all.", []),
    ],
)
@pytest.mark.parametrize("seed", [None, *range(12)])
def test_recipients_make_content_and_calls(text: str, content: str, calls: list[tuple[str, object]], seed: int | None) -> None:
    out = read(text, seed)
    assert out.content == content
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == calls


def test_without_tools_the_answer_loses_its_recipient_line() -> None:
    """The generation prompt ends with `>>>`: a plain answer starts `all\\n` with or
    without tools, and that line is not the answer's."""
    assert read("all\nHi there.", None, tools=False).content == "Hi there."
    cut = read('f\n{"a": ', None, cut=True)
    assert cut.calls == [] and cut.content == ""


def test_the_template_is_read_and_its_calls_parse_back() -> None:
    source = TEMPLATE.read_text(encoding="utf-8")
    assert detect_tool_format(source) == "functionary_v3_2"
    t = JinjaTemplate(source, "<|begin_of_text|>", "<|eot_id|>")
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    msgs = [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(role="assistant", content="", tool_calls=[ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}')]),
        ChatMessage(role="tool", content="21", tool_call_id="c1", name="get_weather"),
    ]
    text = t.render(msgs, tools=[weather])
    assert text.endswith(">>>")
    written = text[text.index(">>>get_weather") + 3 :]
    out = read(written.split("<|eot_id|>")[0], None)
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == [("get_weather", {"city": "Paris"})]
    grammar = tool_choice_grammar("functionary_v3_2", [weather], parallel=True)
    assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", grammar)) == ""
