"""Issue 22, item 3: the tool-call formats of llama.cpp's common/chat.cpp beyond hermes,
llama3 and mistral. Each case is a model output from llama.cpp's tests/test-chat.cpp (the
llama.cpp that llama-cpp-python 0.3.36 vendors), parsed whole and streamed in random
pieces; each template of tests/fixtures/templates is detected as its family, and the call
it writes in a conversation's history parses back as that call; every forced-call grammar
compiles and its own sentence parses back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest

from router.generation.calls import Call
from router.generation.chat_output import ChatOutput, call_id
from router.generation.tool_blocks import calls_in
from router.generation.tool_calls import Piece, ToolCallParser
from router.generation.tool_grammar import tool_choice_grammar
from tests.unit.router.generation.test_tool_calls import check, merged, parse, splits
from worker.chat_formats import BLOCKS, detect_tool_format, reasoning_tags
from worker.chat_template import JinjaTemplate
from worker.protocol import ChatMessage, ToolCall, ToolFormat

TEMPLATES = Path(__file__).resolve().parents[3] / "fixtures" / "templates"


def call(name: str, args: dict[str, Any], own: str | None = None) -> Call:
    return Call(name=name, arguments=json.dumps(args), id=own)


SPECIAL = call("special_function", {"arg1": 1})

# (format, output, expected pieces): test-chat.cpp's outputs for each family.
CASES: list[tuple[ToolFormat, str, list[Piece]]] = [
    (  # test-chat.cpp, DeepSeek R1 (llama-cpp-deepseek-r1.jinja), after its </think>
        "deepseek_r1",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n"
        '{"arg1": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        [SPECIAL],
    ),
    (  # DeepSeek V3.1: content, then two calls in one section
        "deepseek_v3_1",
        "CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"
        "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ["CONTENT", call("get_time", {"city": "Paris"}), call("get_weather", {"city": "Paris"})],
    ),
    (  # Command R7B: its own names, and its id kept
        "command_r7b",
        '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": 1}}\n]<|END_ACTION|>',
        [call("special_function", {"arg1": 1}, "0")],
    ),
    (  # Kimi K2: the id is functions.NAME:INDEX
        "kimi_k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>"
        '{"arg1": 1}<|tool_call_end|><|tool_calls_section_end|>',
        [call("special_function", {"arg1": 1}, "functions.special_function:0")],
    ),
    ("nemotron", '<TOOLCALL>[{"name": "special_function", "arguments": {"arg1": 1}}]</TOOLCALL>', [SPECIAL]),
    (
        "seed_oss",
        "Let me check.\n<seed:tool_call>\n<function=special_function>\n<parameter=arg1>1</parameter>\n</function>\n</seed:tool_call>",
        ["Let me check.\n", SPECIAL],
    ),
    (
        "minimax_m2",
        '<minimax:tool_call>\n<invoke name="special_function">\n<parameter name="arg1">1</parameter>\n</invoke>\n</minimax:tool_call>',
        [SPECIAL],
    ),
    ("firefunction", ' functools[{"name": "special_function", "arguments": {"arg1": 1}}]', [SPECIAL]),
    (  # Functionary v3.1 (Llama 3.1): calls one after another
        "functionary_v3_1",
        'Hi<function=a>{"x": 1}</function><function=b>{}</function>',
        ["Hi", call("a", {"x": 1}), Call(name="b", arguments="{}")],
    ),
    ("apriel", '<tool_calls>[{"name": "special_function", "arguments": {"arg1": 1}}]</tool_calls>', [SPECIAL]),
    (  # MiniMax M1 writes the same section with one JSON object per line
        "apriel",
        '<tool_calls>\n{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {"y": 2}}\n</tool_calls>',
        [Call(name="a", arguments="{}"), call("b", {"y": 2})],
    ),
    (  # Qwen3-Coder, Qwen 3.5, Nemotron 3: XML inside <tool_call>
        "hermes",
        "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
        [SPECIAL],
    ),
    (  # GLM 4.7: key/value tags; a call without arguments
        "hermes",
        "<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call>"
        "<tool_call>read_file_diff_md</tool_call>",
        [SPECIAL, Call(name="read_file_diff_md", arguments="{}")],
    ),
    (  # Mistral Small 3.2, Devstral, Magistral: NAME[CALL_ID]ID[ARGS]{...}, one marker a call
        "mistral",
        '[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
        '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}',
        [call("special_function", {"arg1": 1}, "000000001"), call("special_function_with_opt", {"arg1": 1, "arg2": 2}, "000000002")],
    ),
    ("mistral", '[TOOL_CALLS]special_function[ARGS]{"arg1":1}', [SPECIAL]),
    (  # test-chat.cpp, LFM2: Python calls
        "lfm2",
        'Let me check the time.<|tool_call_start|>[get_time(city="Paris"), special_function(arg1=1, on=true)]<|tool_call_end|>',
        ["Let me check the time.", call("get_time", {"city": "Paris"}), call("special_function", {"arg1": 1, "on": True})],
    ),
    (  # test-chat.cpp, Gemma 4: its own quotes and bare keys
        "gemma4",
        'Hello, world!\nWhat\'s up?<|tool_call>call:get_time{city:<|"|>Paris, "FR"<|"|>,n:42,o:{x:[1,true]}}<tool_call|>',
        ["Hello, world!\nWhat's up?", call("get_time", {"city": 'Paris, "FR"', "n": 42, "o": {"x": [1, True]}})],
    ),
    (  # Apertus: the function's name is the object's key
        "apertus",
        '<|tools_prefix|>[{"special_function": {"arg1": 1}}, {"now": {}}]<|tools_suffix|>',
        [SPECIAL, Call(name="now", arguments="{}")],
    ),
    (  # test-chat.cpp, DeepSeek V4 (DSML): string="true" values are text
        "deepseek_v4",
        '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_time">\n<｜DSML｜parameter name="city" string="true">Tokyo'
        '</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        '</｜DSML｜tool_calls>',
        ["\n\n", call("get_time", {"city": "Tokyo", "days": 3})],
    ),
    (
        "deepseek_v3_2",
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="special_function">\n<｜DSML｜parameter name="arg1" '
        'string="false">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
        [SPECIAL],
    ),
    (  # test-chat.cpp, Kimi K3 (its reasoning and response tags are split off elsewhere)
        "kimi_k3",
        '<|open|>tools<|sep|><|open|>call tool="special_function" index="1"<|sep|><|open|>argument key="arg1" '
        'type="number"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>',
        [SPECIAL],
    ),
    (  # test-chat.cpp, GigaChat 3
        "gigachat_v3",
        'Hello, world!\nWhat\'s up?<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "special_function", "arguments": {"arg1": 1}}',
        ["Hello, world!\nWhat's up?", SPECIAL],
    ),
    ("gigachat_v3_1", '<|function_call|>{"name": "special_function", "arguments": {"arg1": 1}}', [SPECIAL]),
    (  # test-chat.cpp, Command R+
        "command_r_plus",
        'Action:\n```json\n[{"tool_name": "special_function", "parameters": {"arg1": 1}}]\n```',
        [SPECIAL],
    ),
    (  # test-chat.cpp, MiniCPM 5; a value in CDATA is its text
        "minicpm5",
        '<function name="python"><param name="code">print(\'hey\')</param></function>\n'
        '<function name="calc"><param name="expr"><![CDATA[1 < 2]]></param></function>',
        [call("python", {"code": "print('hey')"}), call("calc", {"expr": "1 < 2"})],
    ),
    (  # Tencent Hy3: GLM's layout, tags suffixed :opensource
        "hy3",
        "<tool_calls:opensource>\n<tool_call:opensource>special_function<tool_sep:opensource>\n"
        "<arg_key:opensource>arg1</arg_key:opensource>\n<arg_value:opensource>1</arg_value:opensource>\n"
        "</tool_call:opensource>\n</tool_calls:opensource>",
        [SPECIAL],
    ),
    (  # test-chat.cpp, MiniMax M3: namespaced tags; nested values are objects and arrays
        "minimax_m3",
        ']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="special_function">]<]minimax[>[<arg1>1]<]minimax[>[</arg1>'
        ']<]minimax[>[<cfg>]<]minimax[>[<a>x]<]minimax[>[</a>]<]minimax[>[<b>]<]minimax[>[<item>1]<]minimax[>[</item>'
        ']<]minimax[>[<item>2]<]minimax[>[</item>]<]minimax[>[</b>]<]minimax[>[</cfg>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>',
        [call("special_function", {"arg1": 1, "cfg": {"a": "x", "b": [1, 2]}})],
    ),
    ("lfm2", "<|tool_call_start|>[__import__('os').system('x')]<|tool_call_end|>", ["<|tool_call_start|>[__import__('os').system('x')]<|tool_call_end|>"]),
    # Sections that hold no call are content, as llama.cpp leaves them
    ("nemotron", "<TOOLCALL>not json</TOOLCALL> after", ["<TOOLCALL>not json</TOOLCALL> after"]),
    ("deepseek_v3_1", "no calls here", ["no calls here"]),
]


@pytest.mark.parametrize(("fmt", "text", "expected"), CASES)
def test_each_familys_calls_parse_whole_and_streamed(fmt: ToolFormat, text: str, expected: list[Piece]) -> None:
    check(fmt, text, expected)


def test_tagged_values_follow_the_declared_types() -> None:
    """A tagged value is text: "7" stays a string for a string parameter (a zip code), and
    is the number 7 for an integer one (llama.cpp reads them by the schema likewise)."""
    body = "<function=f>\n<parameter=zip>\n07\n</parameter>\n<parameter=n>\n7\n</parameter>\n</function>"
    (c,) = calls_in("seed_oss", body, {"f": {"zip": "string", "n": "integer"}}) or []
    assert json.loads(c.arguments) == {"zip": "07", "n": 7}
    (guess,) = calls_in("seed_oss", body) or []
    assert json.loads(guess.arguments)["n"] == 7


# (template, its family)
FAMILIES = [
    ("llama-cpp-deepseek-r1.jinja", "deepseek_r1"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseek_r1"),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseek_v3_1"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "command_r7b"),
    ("moonshotai-Kimi-K2.jinja", "kimi_k2"),
    ("NVIDIA-Nemotron-Nano-v2.jinja", "nemotron"),
    ("ByteDance-Seed-OSS.jinja", "seed_oss"),
    ("MiniMax-M2.jinja", "minimax_m2"),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", "firefunction"),
    ("meetkai-functionary-medium-v3.1.jinja", "functionary_v3_1"),
    ("unsloth-Apriel-1.5.jinja", "apriel"),
    ("Qwen3-Coder.jinja", "hermes"),
    ("GLM-4.6.jinja", "hermes"),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral"),
]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.parametrize(("name", "fmt"), FAMILIES)
def test_each_template_is_read_as_its_family(name: str, fmt: str) -> None:
    assert detect_tool_format((TEMPLATES / name).read_text(encoding="utf-8")) == fmt


@pytest.mark.parametrize(
    ("snippet", "fmt"),
    [  # the markers llama.cpp's common/chat.cpp detects these families by
        ("{{- '<|tool_call>call:' + function['name'] + '{' -}}", "gemma4"),
        ("List of tools: <|tool_list_start|>[{{ tools }}]<|tool_list_end|>", "lfm2"),
        ("List of tools: [{{ tools | tojson }}]", "lfm2"),
        ("{{ '<|tools_prefix|>' + calls + '<|tools_suffix|>' }}", "apertus"),
        ("{%- set dsml_token = '｜DSML｜' -%}{{ '<' + dsml_token + 'function_calls>' }}", "deepseek_v3_2"),
        ("{%- set dsml_token = '｜DSML｜' -%}{{ '<' + dsml_token + 'tool_calls>' }}", "deepseek_v4"),
        ("{{ '<|open|>' + tag }}{{ open_tag('tools') }}{{ open_tag('call', [('tool', n)]) }}", "kimi_k3"),
        ("{{ '<|message_sep|>' }}{{ 'function call' + '<|role_sep|>' }}", "gigachat_v3"),
        ("{{ '<|function_call|>' + call }}", "gigachat_v3_1"),
        ("{{ 'Action:\\n```json\\n[\\n' }}", "command_r_plus"),
        ('{{ \'<function name="\' + n + \'"><param name="\' + k }}', "minicpm5"),
        ("{%- set HYTK = ':opensource' %}{{ '<tool_call{}>'.format(HYTK) }}", "hy3"),
        ("{%- set ns_token = ']<]minimax[>[' -%}{{ ns_token ~ '<tool_call>' }}", "minimax_m3"),
    ],
)
def test_the_other_families_are_read_by_their_markers(snippet: str, fmt: str) -> None:
    assert detect_tool_format(snippet) == fmt


@pytest.mark.parametrize(("name", "fmt"), FAMILIES)
def test_a_call_as_the_template_writes_it_parses_back(name: str, fmt: ToolFormat) -> None:
    """The round trip: the template renders an earlier call in the history; from the
    format's first marker after the question, the parser reads that call (what follows it
    is the template's own text, content to the parser)."""
    t = JinjaTemplate((TEMPLATES / name).read_text(encoding="utf-8"), "<s>", "</s>")
    own = "functions.get_weather:0" if fmt == "kimi_k2" else "abc123XYZ"
    msgs = [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(role="assistant", content="", tool_calls=[ToolCall(id=own, name="get_weather", arguments='{"city": "Paris"}')]),
        ChatMessage(role="tool", content="21", tool_call_id=own, name="get_weather"),
    ]
    text = t.render(msgs, tools=[WEATHER])
    after = text[text.index("Weather in Paris?") + len("Weather in Paris?") :]
    marker = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]"}.get(fmt) or BLOCKS[fmt][0]
    start = after.find(marker)
    assert start >= 0, (marker, after)
    calls = [p for p in parse(fmt, [after[start:]]) if isinstance(p, Call)]
    assert [(c.name, json.loads(c.arguments)) for c in calls][:1] == [("get_weather", {"city": "Paris"})]
    for seed in range(10):
        streamed = [p for p in parse(fmt, splits(after[start:], seed)) if isinstance(p, Call)]
        assert streamed == calls


def test_a_template_that_never_shows_the_tools_gets_them_in_the_system_message() -> None:
    """DeepSeek's templates render calls but not the tools on offer: the tools and how to
    call them go into the system message, in the format's own layout."""
    t = JinjaTemplate((TEMPLATES / "deepseek-ai-DeepSeek-V3.1.jinja").read_text(encoding="utf-8"), "<s>", "</s>")
    text = t.render([ChatMessage(role="user", content="Weather?")], tools=[WEATHER])
    assert '"name": "get_weather"' in text and "<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS" in text
    assert text.index("get_weather") < text.index("Weather?")
    plain = t.render([ChatMessage(role="user", content="Weather?")])
    assert "get_weather" not in plain


SENTENCES: dict[str, str] = {
    "minicpm5": '<function name="[{"name": "get_weather", "arguments": {"city": "Paris"}}]</function>',
    "hy3": '<tool_calls:opensource>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls:opensource>',
    "minimax_m3": ']<]minimax[>[<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]]<]minimax[>[</tool_call>',
    "deepseek_v4": '<｜DSML｜tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</｜DSML｜tool_calls>',
    "kimi_k3": '<|open|>tools<|sep|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|close|>tools<|sep|>',
    "gigachat_v3_1": '<|function_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "command_r_plus": 'Action:\n```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]```',
    "lfm2": '<|tool_call_start|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|tool_call_end|>',
    "gemma4": '<|tool_call>call:get_weather{"city": "Paris"}<tool_call|>',
    "apertus": '<|tools_prefix|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|tools_suffix|>',
    # A sentence each forced grammar must accept, and the calls it parses to.
    "deepseek_r1": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek_v3_1": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "command_r7b": '<|START_ACTION|>[{"tool_name": "get_weather", "parameters": {"city": "Paris"}}]<|END_ACTION|>',
    "kimi_k2": '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    "nemotron": '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>',
    "seed_oss": '<seed:tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</seed:tool_call>',
    "minimax_m2": '<minimax:tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</minimax:tool_call>',
    "firefunction": ' functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "functionary_v3_1": '<function=get_weather>{"city": "Paris"}</function>',
    "apriel": '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>',
}


@pytest.mark.parametrize("fmt", sorted(SENTENCES))
@pytest.mark.parametrize("parallel", [False, True])
def test_forced_grammars_compile_and_what_they_force_parses_as_the_call(fmt: ToolFormat, parallel: bool) -> None:
    grammar = tool_choice_grammar(fmt, [WEATHER, {"type": "function", "function": {"name": "now"}}], parallel)
    assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", grammar)) == ""
    for name in ("get_weather",):
        assert f'"{name}"' in grammar or name in grammar
    calls = [p for p in parse(fmt, [SENTENCES[fmt]]) if isinstance(p, Call)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_kimi_calls_keep_or_get_ids_its_template_can_name() -> None:
    """Kimi K2's template writes a call's id where the name goes (`functions.NAME:INDEX`)."""
    assert call_id("kimi_k2", "functions.f:0", "f", 3) == "functions.f:0"
    assert call_id("kimi_k2", None, "f", 3) == "functions.f:3"
    assert call_id("kimi_k2", "functions.g:0", "f", 1) == "functions.f:1"  # an id naming another function
    assert call_id("hermes", "functions.f:0", "f").startswith("call_")


@pytest.mark.parametrize(
    ("fmt", "first", "second", "closing"),
    [
        ("apriel", '<tool_calls>[{"name": "a", "arguments": {}}', ', {"name": "b", "arguments": {}}', "]</tool_calls>"),
        (
            "deepseek_v3_1",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
            "<｜tool▁call▁begin｜>b<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
            "<｜tool▁calls▁end｜>",
        ),
        (
            "minimax_m2",
            '<minimax:tool_call>\n<invoke name="a">\n</invoke>',
            '\n<invoke name="b">\n</invoke>',
            "\n</minimax:tool_call>",
        ),
    ],
)
def test_a_sections_calls_come_out_one_by_one_and_a_cut_keeps_the_whole_ones(
    fmt: ToolFormat, first: str, second: str, closing: str
) -> None:
    """A forced answer whose model writes call after call (the demo model does) is seen to
    repeat itself only if each call comes out once whole; and max_tokens cutting the section
    must not lose the calls already written (issue 20's rule for arrays)."""
    a, b = Call(name="a", arguments="{}"), Call(name="b", arguments="{}")
    p = ToolCallParser(fmt)
    assert p.feed(first) == [a]
    assert p.feed(second) == [b]
    assert p.feed(closing) == [] and p.finish() == []
    cut = ToolCallParser(fmt)
    assert cut.feed(first + second[:-3]) == [a]
    assert cut.finish(cut=True) == []
    whole = ToolCallParser(fmt)
    assert merged(whole.feed(first + second + closing + " then text") + whole.finish()) == [a, b, "then text"]


@pytest.mark.parametrize("seed", range(8))
def test_a_call_first_in_a_block_the_prompt_opened_is_the_answer_not_reasoning(seed: int) -> None:
    """MiniMax M2's template always opens <think>; a forced call's grammar writes the call
    from the first token. That call is the answer: on the first try it all went to
    reasoning_content and the forced call came back as nothing."""
    text = '\n<minimax:tool_call>\n{"name": "a", "arguments": {}}\n</minimax:tool_call>'
    out = ChatOutput(tools="minimax_m2", reasoning=True, in_reasoning=True)
    for chunk in splits(text, seed):
        out.feed(chunk)
    out.finish()
    assert [(c.name, c.arguments) for c in out.calls] == [("a", "{}")] and out.reasoning_text == ""
    # Reasoning first: a marker later in it is reasoning, as before.
    thought = ChatOutput(tools="minimax_m2", reasoning=True, in_reasoning=True)
    for chunk in splits("Let me see <minimax:tool_call> later</think>Fine.", seed):
        thought.feed(chunk)
    thought.finish()
    assert thought.calls == [] and thought.reasoning_text == "Let me see <minimax:tool_call> later"
    assert thought.content == "Fine."


@pytest.mark.parametrize(
    ("fmt", "tags", "text", "reasoning", "content", "calls"),
    [
        (  # test-chat.cpp, Command R7B: its thinking tags, its answer's wrapper dropped
            "command_r7b", ("<|START_THINKING|>", "<|END_THINKING|>"),
            "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>",
            "I'm\nthinking", "Hello, world!\nWhat's up?", [],
        ),
        (
            "command_r7b", ("<|START_THINKING|>", "<|END_THINKING|>"),
            '<|START_THINKING|>I\'m\nthinking<|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": "0", '
            '"tool_name": "special_function", "parameters": {"arg1": 1}}\n]<|END_ACTION|>',
            "I'm\nthinking", "", [("special_function", {"arg1": 1})],
        ),
        (  # test-chat.cpp, Ministral 3 / Magistral
            "mistral", ("[THINK]", "[/THINK]"),
            '[THINK]I\'m\nthinking[/THINK][TOOL_CALLS]special_function[ARGS]{"arg1":1}',
            "I'm\nthinking", "", [("special_function", {"arg1": 1})],
        ),
        (  # test-chat.cpp, Seed-OSS
            "seed_oss", ("<seed:think>", "</seed:think>"),
            "<seed:think>I'm thinking about the answer</seed:think>\nHello, world!",
            "I'm thinking about the answer", "Hello, world!", [],
        ),
    ],
)
@pytest.mark.parametrize("seed", [None, *range(10)])
def test_each_familys_reasoning_tags_and_content_wrappers(
    fmt: ToolFormat, tags: tuple[str, str], text: str, reasoning: str, content: str,
    calls: list[tuple[str, object]], seed: int | None,
) -> None:
    out = ChatOutput(tools=fmt, reasoning=True, reasoning_tags=tags, model_format=fmt)
    for chunk in [text] if seed is None else splits(text, seed):
        out.feed(chunk)
    out.finish()
    assert (out.reasoning_text, out.content) == (reasoning, content)
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == calls


@pytest.mark.parametrize(
    ("name", "tags"),
    [
        ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", ("<|START_THINKING|>", "<|END_THINKING|>")),
        ("ByteDance-Seed-OSS.jinja", ("<seed:think>", "</seed:think>")),
        ("Qwen-Qwen3-0.6B.jinja", ("<think>", "</think>")),
        ("Mistral-Small-3.2-24B-Instruct-2506.jinja", None),
    ],
)
def test_each_template_names_its_reasoning_tags(name: str, tags: tuple[str, str] | None) -> None:
    assert reasoning_tags((TEMPLATES / name).read_text(encoding="utf-8")) == tags
    assert reasoning_tags("{{ '[THINK]' + thinking + '[/THINK]' }}") == ("[THINK]", "[/THINK]")


@pytest.mark.parametrize("seed", [None, *range(10)])
def test_kimi_k3s_thinking_response_and_tools(seed: int | None) -> None:
    """test-chat.cpp, Kimi K3: its prompt opens <|open|>think<|sep|>; the answer closes it,
    wraps its content in response tags and ends the message; none of those is content."""
    text = (
        "I should call it<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|>"
        '<|open|>tools<|sep|><|open|>call tool="special_function" index="1"<|sep|><|open|>argument key="arg1" '
        'type="number"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>'
    )
    out = ChatOutput(
        tools="kimi_k3", reasoning=True, in_reasoning=True, model_format="kimi_k3",
        reasoning_tags=("<|open|>think<|sep|>", "<|close|>think<|sep|>"),
    )
    for chunk in [text] if seed is None else splits(text, seed):
        out.feed(chunk)
    out.finish()
    assert (out.reasoning_text, out.content) == ("I should call it", "On it.")
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == [("special_function", {"arg1": 1})]


@pytest.mark.parametrize("fmt", ["mistral", "llama3", "nemotron", "generic"])
def test_a_long_call_streams_in_linear_time(fmt: ToolFormat) -> None:
    """On the first try a call with 20 KB of arguments, fed 4 characters at a time, cost
    2.3 s of the router's CPU (the JSON scanned from its start on every token), growing with
    the square of its length. Now each feed reads only what is new: the scan count is
    checked, not a time."""
    from router.generation import calls as calls_module

    args = json.dumps({"content": "function f() { return {a: [1, 2]}; }\n" * 400})
    text = {
        "mistral": f'[TOOL_CALLS][{{"name": "w", "arguments": {args}}}]',
        "llama3": f'{{"name": "w", "parameters": {args}}}',
        "nemotron": f'<TOOLCALL>[{{"name": "w", "arguments": {args}}}]</TOOLCALL>',
        "generic": f'{{"tool_calls": [{{"name": "w", "arguments": {args}}}]}}',
    }[fmt]
    scanned = 0
    original = calls_module.JsonScanner.end

    def counting(self: calls_module.JsonScanner, t: str) -> int | None:
        nonlocal scanned
        before = len(self._seen) if t.startswith(self._seen) else 0
        result = original(self, t)
        scanned += len(self._seen) - before
        return result

    calls_module.JsonScanner.end = counting  # type: ignore[method-assign]
    try:
        p = ToolCallParser(fmt)
        out: list[Piece] = []
        for i in range(0, len(text), 4):
            out += p.feed(text[i : i + 4])
        out += p.finish()
    finally:
        calls_module.JsonScanner.end = original  # type: ignore[method-assign]
    assert [c.name for c in out if isinstance(c, Call)] == ["w"]
    # each character read about once (and read at all: the scanner is what finds the end)
    assert len(args) <= scanned <= 3 * len(text), (scanned, len(text))
