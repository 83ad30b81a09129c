"""Issue 22, item 3: muse-glimmer's recipient messages (router/generation/muse.py), with
llama.cpp's tests/test-chat.cpp output for its muse_glimmer handler, whole and streamed."""

from __future__ import annotations

import json

import llguidance
import pytest

from router.generation.chat_output import ChatOutput
from router.generation.tool_grammar import tool_choice_grammar
from tests.unit.router.generation.test_tool_calls import splits
from worker.chat_formats import detect_tool_format


def read(text: str, seed: int | None) -> ChatOutput:
    out = ChatOutput(tools="muse_glimmer", reasoning=True, model_format="muse_glimmer")
    for chunk in [text] if seed is None else splits(text, seed):
        out.feed(chunk)
    out.finish()
    return out


@pytest.mark.parametrize(
    ("text", "reasoning", "content", "calls"),
    [
        (  # test-chat.cpp: content, then a call in its own message
            " to=user<|message|>Hello, world!\nWhat's up?<|eom|><|start|>assistant to=special_function<|message|>"
            '<atem:function_calls>\n<atem:invoke name="special_function">\n<atem:parameter name="arg1">1'
            "</atem:parameter>\n</atem:invoke>\n</atem:function_calls>",
            "", "Hello, world!\nWhat's up?", [("special_function", {"arg1": 1})],
        ),
        (" to=self<|message|>Hmm.<|eom|><|start|>assistant to=user<|message|>Fine.<|eot|>", "Hmm.", "Fine.", []),
        ("No recipient at all.", "", "No recipient at all.", []),
        (  # the layout a forced call's grammar writes
            ' to=special_function<|message|><atem:function_calls>{"arg1": 1}', "", "", [("special_function", {"arg1": 1})],
        ),
    ],
)
@pytest.mark.parametrize("seed", [None, *range(10)])
def test_recipients_make_reasoning_content_and_calls(
    text: str, reasoning: str, content: str, calls: list[tuple[str, object]], seed: int | None
) -> None:
    out = read(text, seed)
    assert (out.reasoning_text, out.content) == (reasoning, content)
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == calls


def test_detected_and_forced() -> None:
    assert detect_tool_format("{{ '<atem:function_calls>' }}{{ ' to=user<|message|>' }}") == "muse_glimmer"
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    grammar = tool_choice_grammar("muse_glimmer", [weather], parallel=False)
    assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", grammar)) == ""
