"""A model's output with a JSON value nested 50,000 deep where its tool-call format expects
one (a small model copies what it is shown) is read as that output with any other text that
is not JSON is read: no exception escapes the parsers.

Before, every parser decoded with `json.loads` and caught ValueError only, and Python's
decoder raises RecursionError past about 1,000 levels: the RecursionError escaped the
parser, failing the request with a 500, or a stream mid-way. Every decode of generated text
now goes through router/server/json_text.py.

Each case is written once with `@` where the value goes. Its expected reading is the same
text with a twin of the value that has the same brackets but is not JSON (`[[...x...]]`),
so that the scanners that find where a value ends see the same text, and only the decode
tells the two apart; the twin is then put back as the deep value it stands for.
"""

from __future__ import annotations

import json

import pytest

from router.generation import answer, calls, tagged_calls
from router.generation.chat_output import ChatOutput
from worker.protocol import ToolFormat

N = 50_000
DEEP = "[" * N + "]" * N
NOT_JSON = "[" * N + "x" + "]" * N  # the same brackets, and not JSON at any depth

# (format, output with `@` where a JSON value goes): each family's layout, as
# test_tool_calls.py and test_tool_blocks.py have it.
CASES: list[tuple[ToolFormat, str]] = [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": @}}\n</tool_call>'),
    ("hermes", "<tool_call>\n<function=f>\n<parameter=a>\n@\n</parameter>\n</function>\n</tool_call>"),
    ("hermes", "<tool_call>f<arg_key>a</arg_key><arg_value>@</arg_value></tool_call>"),
    ("llama3", '{"name": "f", "parameters": {"a": @}}'),
    ("llama3", '<|python_tag|>{"name": "f", "parameters": {"a": @}}'),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": @}}]'),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"a": @}'),
    ("generic", '{"tool_calls": [{"name": "f", "arguments": {"a": @}}]}'),
    ("generic", '{"tool_call": {"name": "f", "arguments": @}}'),
    ("deepseek_r1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
                    '{"a": @}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    ("deepseek_v3_1", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": @}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    ("command_r7b", '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters": {"a": @}}]<|END_ACTION|>'),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
                '{"a": @}<|tool_call_end|><|tool_calls_section_end|>'),
    ("nemotron", '<TOOLCALL>[{"name": "f", "arguments": {"a": @}}]</TOOLCALL>'),
    ("seed_oss", "<seed:tool_call>\n<function=f>\n<parameter=a>@</parameter>\n</function>\n</seed:tool_call>"),
    ("minimax_m2", '<minimax:tool_call>\n<invoke name="f">\n<parameter name="a">@</parameter>\n</invoke>\n</minimax:tool_call>'),
    ("firefunction", ' functools[{"name": "f", "arguments": {"a": @}}]'),
    ("functionary_v3_1", '<function=f>{"a": @}</function>'),
    ("apriel", '<tool_calls>[{"name": "f", "arguments": {"a": @}}]</tool_calls>'),
    ("gemma4", "<|tool_call>call:f{a:@}<tool_call|>"),
    ("apertus", '<|tools_prefix|>[{"f": {"a": @}}]<|tools_suffix|>'),
    ("deepseek_v3_2", '<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" '
                      'string="false">@</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>'),
    ("deepseek_v4", '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="false">@'
                    "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"),
    ("kimi_k3", '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument key="a" '
                'type="array"<|sep|>@<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>'),
    ("gigachat_v3", '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "f", "arguments": {"a": @}}'),
    ("gigachat_v3_1", '<|function_call|>{"name": "f", "arguments": {"a": @}}'),
    ("command_r_plus", 'Action:\n```json\n[{"tool_name": "f", "parameters": {"a": @}}]\n```'),
    ("minicpm5", '<function name="f"><param name="a">@</param></function>'),
    ("hy3", "<tool_calls:opensource>\n<tool_call:opensource>f<tool_sep:opensource>\n<arg_key:opensource>a"
            "</arg_key:opensource>\n<arg_value:opensource>@</arg_value:opensource>\n</tool_call:opensource>\n"
            "</tool_calls:opensource>"),
    ("minimax_m3", ']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="f">]<]minimax[>[<a>@]<]minimax[>[</a>'
                   "]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>"),
    ("gpt_oss", '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": @}<|call|>'),
    ("functionary_v3_2", 'f\n{"a": @}'),
    ("muse_glimmer", " to=f<|message|><atem:function_calls>{\"a\": @}"),
]


def _read(fmt: ToolFormat, text: str, pieces: int) -> tuple[str, str, list[tuple[str, str]]]:
    """Content, reasoning and calls (name, arguments) of `text`, fed in `pieces` parts."""
    out = ChatOutput(tools=fmt, reasoning=False, harmony=fmt == "gpt_oss", model_format=fmt)
    step = -(-len(text) // pieces)
    for i in range(0, len(text), step):
        out.feed(text[i : i + step])
    out.finish()
    return out.content, out.reasoning_text, [(c.name, c.arguments) for c in out.calls]


def _deep(reading: tuple[str, str, list[tuple[str, str]]]) -> tuple[str, str, list[tuple[str, str]]]:
    """A reading of the NOT_JSON text, with the deep value back where NOT_JSON stood."""
    content, reasoning, made = reading
    return (content.replace(NOT_JSON, DEEP), reasoning.replace(NOT_JSON, DEEP),
            [(name, args.replace(NOT_JSON, DEEP)) for name, args in made])


@pytest.mark.parametrize(("fmt", "text"), CASES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(CASES)])
@pytest.mark.parametrize("pieces", [1, 7])
def test_a_call_nested_50000_deep_reads_as_one_that_is_not_json(fmt: ToolFormat, text: str, pieces: int) -> None:
    assert _read(fmt, text.replace("@", DEEP), pieces) == _deep(_read(fmt, text.replace("@", NOT_JSON), pieces))


def test_the_readers_of_a_calls_arguments_take_deep_json_as_not_json() -> None:
    # Whether arguments are whole (an upstream's calls): not a JSON object.
    assert calls.arguments_whole(DEEP) is calls.arguments_whole(NOT_JSON) is False
    # Arguments a model wrote as text: kept as text, quoted.
    made = calls.call_from({"name": "f", "arguments": DEEP})
    assert made is not None and made.arguments == '"' + DEEP + '"'
    # Ollama's and Anthropic's arguments objects: the text under "arguments".
    assert answer.arguments(DEEP) == {"arguments": DEEP}
    # A tagged parameter's value: its text.
    assert tagged_calls.typed_value(DEEP, None) == DEEP


@pytest.mark.parametrize("depth", [500, 3000])
def test_minimax_m3_tags_nested_thousands_deep_keep_the_deep_value_as_text(depth: int) -> None:
    # Its nested tags were read by recursion: 500 distinct tags raised RecursionError (a 500).
    inner = "".join(f"<k{i}>" for i in range(depth)) + "1" + "".join(f"</k{i}>" for i in reversed(range(depth)))
    found = tagged_calls.minimax_m3_calls(f'<invoke name="f"><a>{inner}</a></invoke>', {})
    assert found is not None and found[0].name == "f"
    value = json.loads(found[0].arguments)["a"]
    for i in range(tagged_calls._M3_DEPTH):
        value = value[f"k{i}"]
    assert isinstance(value, str) and value.startswith(f"<k{tagged_calls._M3_DEPTH}>")
