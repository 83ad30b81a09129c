"""The forced-call grammars against the demo model's real vocabulary: llguidance, built on
the GGUF's tokenizer as the worker's constraint engine builds it (its tokens' bytes read
back from the cache, checked against llguidance's own llama.cpp bridge), accepts a valid call in
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
from worker import vocab_pieces
from worker.constraint import tokenizer_for
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


@pytest.fixture(scope="module")
def vocab() -> Iterator[llama_cpp.llama_vocab_p]:
    if not DEMO_MODEL.is_file():
        pytest.fail(f"demo model missing at {DEMO_MODEL}: run `make model`")
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(DEMO_MODEL).encode(), params)
    assert model
    yield llama_cpp.llama_model_get_vocab(model)
    llama_cpp.llama_model_free(model)


@pytest.fixture(scope="module")
def tokenizer(vocab: llama_cpp.llama_vocab_p, tmp_path_factory: pytest.TempPathFactory) -> llguidance.LLTokenizer:
    """As the worker builds it: the tokens' bytes written to a cache folder by one load and
    read back by the next (worker/vocab_pieces.py)."""
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    ident = vocab_pieces.identity(str(DEMO_MODEL), llama_cpp.__version__, n)
    folder = tmp_path_factory.mktemp("vocab-cache")
    is_eog = lambda t: bool(llama_cpp.llama_vocab_is_eog(vocab, t))  # noqa: E731
    built = vocab_pieces.load_or_build(ident, folder, lambda: vocab_pieces.build(vocab, n, is_eog), lambda p: False)
    read = vocab_pieces.load_or_build(ident, folder, lambda: pytest.fail("built twice"), lambda p: vocab_pieces.agrees(p, vocab, is_eog))
    assert read == built
    return tokenizer_for(vocab, n, is_eog, read)


def test_the_workers_tokenizer_is_llguidances_own_on_every_token(
    vocab: llama_cpp.llama_vocab_p, tokenizer: llguidance.LLTokenizer
) -> None:
    """The bytes cached and read back give llguidance the tokenizer its own llama.cpp bridge
    builds (which calls the deprecated llama_token_get_attr once per token), token by token,
    with every end-of-generation token as EOS."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        eog = [t for t in range(tokenizer.vocab_size) if llama_cpp.llama_vocab_is_eog(vocab, t)]
        own = lltokenizer_from_vocab(vocab, eos_token=eog)
    assert tokenizer.vocab_size == own.vocab_size == llama_cpp.llama_vocab_n_tokens(vocab)
    assert tokenizer.eos_tokens == own.eos_tokens and len(eog) >= 2  # <eos> and <end_of_turn>
    for t in range(own.vocab_size):
        assert tokenizer.decode_bytes([t]) == own.decode_bytes([t]), t
        assert tokenizer.is_special_token(t) == own.is_special_token(t), t
    text = "Sure! <tool_call>\n{\"city\": \"Zürich 東京\"}</tool_call>"
    assert tokenizer.tokenize_str(text) == own.tokenize_str(text)


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
