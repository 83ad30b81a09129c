"""The forced-call grammars against the demo model's real vocabulary: llguidance, built on
the GGUF's tokenizer as the worker's constraint engine builds it, accepts a valid call in
each format token by token and refuses arguments that break the function's schema.

Needs only the GGUF's vocabulary (no weights, no server), so it runs in seconds.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterator

import llama_cpp
import llguidance
import pytest
from llguidance.llamacpp import lltokenizer_from_vocab

from router.generation.tool_grammar import tool_choice_grammar
from tests.e2e.conftest import DEMO_MODEL
from worker.protocol import ToolFormat

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "now"}},
    # What pydantic writes for a nested model: a local $ref into the schema's own $defs.
    {
        "type": "function",
        "function": {
            "name": "book",
            "parameters": {
                "type": "object",
                "properties": {"place": {"$ref": "#/$defs/Place"}},
                "required": ["place"],
                "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            },
        },
    },
]


# llguidance's bridge calls llama_token_get_attr once per token, deprecated in llama-cpp-python.
@pytest.fixture(scope="module")
def tokenizer() -> Iterator[llguidance.LLTokenizer]:
    if not DEMO_MODEL.is_file():
        pytest.fail(f"demo model missing at {DEMO_MODEL}: run `make model`")
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(DEMO_MODEL).encode(), params)
    assert model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tok = lltokenizer_from_vocab(llama_cpp.llama_model_get_vocab(model))
    yield tok
    llama_cpp.llama_model_free(model)


def accepts(
    tok: llguidance.LLTokenizer, fmt: ToolFormat, parallel: bool, text: str, tools: list[dict[str, Any]] = TOOLS
) -> bool:
    grammar = llguidance.grammar_from("lark", tool_choice_grammar(fmt, tools, parallel))
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    matcher = llguidance.LLMatcher(tok, grammar)
    ok = matcher.consume_tokens(tok.tokenize_str(text))
    return ok and not matcher.is_error() and matcher.is_accepting()


PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
BOOK = '{"name": "book", "arguments": {"place": {"city": "Paris"}}}'


@pytest.mark.parametrize(
    ("fmt", "parallel", "text"),
    [
        ("generic", False, '{"tool_calls": [' + PARIS + "]}"),
        ("generic", True, '{"tool_calls": [' + PARIS + ', {"name": "now", "arguments": {}}]}'),
        ("hermes", False, "<tool_call>\n" + PARIS + "\n</tool_call>"),
        ("hermes", True, "<tool_call>\n" + PARIS + "\n</tool_call>\n<tool_call>\n" + PARIS + "\n</tool_call>"),
        ("mistral", True, "[TOOL_CALLS][" + PARIS + ", " + PARIS + "]"),
        ("llama3", False, '{"name": "now", "parameters": {}}'),
        # a function that declares no parameters takes any object
        ("generic", False, '{"tool_calls": [{"name": "now", "arguments": {"any": 1}}]}'),
        # a $ref into the parameters' own $defs, wherever the format puts the arguments
        ("generic", False, '{"tool_calls": [' + BOOK + "]}"),
        ("hermes", False, "<tool_call>\n" + BOOK + "\n</tool_call>"),
        ("mistral", False, "[TOOL_CALLS][" + BOOK + "]"),
        ("llama3", False, '{"name": "book", "parameters": {"place": {"city": "Paris"}}}'),
    ],
)
def test_a_valid_call_is_accepted(tokenizer: llguidance.LLTokenizer, fmt: ToolFormat, parallel: bool, text: str) -> None:
    assert accepts(tokenizer, fmt, parallel, text)


@pytest.mark.parametrize(
    ("fmt", "parallel", "text"),
    [
        ("generic", False, '{"tool_calls": [{"name": "get_weather", "arguments": {"town": "Paris"}}]}'),  # schema
        ("generic", False, '{"tool_calls": [' + PARIS + ", " + PARIS + "]}"),  # two calls, parallel off
        ("generic", False, '{"tool_calls": [{"name": "delete_all", "arguments": {}}]}'),  # undeclared function
        # Free whitespace: a forced call is laid out compactly (JSON_LAYOUT), or a small
        # model pads it with newlines until max_tokens.
        ("generic", False, '{"tool_calls":[\n' + PARIS + "]}"),
        ("hermes", False, "Sure! <tool_call>\n" + PARIS + "\n</tool_call>"),  # text instead of a call
        ("hermes", False, "<tool_call>\n" + PARIS + "\n</tool_call>\n<tool_call>\n" + PARIS + "\n</tool_call>"),
        ("mistral", False, "[TOOL_CALLS][" + PARIS + ", " + PARIS + "]"),
        ("llama3", False, '{"name": "get_weather", "parameters": {}}'),  # required city missing
        # keys the parameters do not declare, as llama-server refuses them (schema_rewrite)
        ("generic", False, '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]}'),
        ("hermes", False, '<tool_call>\n{"name": "book", "arguments": {"place": {"city": "Paris", "zip": 1}}}\n</tool_call>'),
        ("mistral", False, '[TOOL_CALLS][{"name": "book", "arguments": {"place": {"city": 5}}}]'),  # the $def's type
    ],
)
def test_an_invalid_call_is_refused(tokenizer: llguidance.LLTokenizer, fmt: ToolFormat, parallel: bool, text: str) -> None:
    assert not accepts(tokenizer, fmt, parallel, text)


def test_a_lone_tool_with_refs_in_the_generic_format(tokenizer: llguidance.LLTokenizer) -> None:
    # One tool is not wrapped in anyOf: its arguments sit at another place in the document.
    assert accepts(tokenizer, "generic", False, '{"tool_calls": [' + BOOK + "]}", TOOLS[2:])
    assert not accepts(tokenizer, "generic", False, '{"tool_calls": [{"name": "book", "arguments": {"place": {}}}]}', TOOLS[2:])
