"""Chat templates from real model families rendered with tools, tool calls and tool results;
format detection; the generic rewrite; assistant prefill; an open reasoning block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker import chat_formats
from worker.chat_template import BuiltinTemplate, JinjaTemplate, TemplateError
from worker.protocol import ChatMessage, ToolCall

TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "templates"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Today's weather <in °C> for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

HISTORY = [
    ChatMessage(role="system", content="Be brief."),
    ChatMessage(role="user", content="Weather in Paris?"),
    ChatMessage(
        role="assistant",
        content="",
        tool_calls=[ToolCall(id="abc123XYZ", name="get_weather", arguments='{"city": "Paris"}')],
    ),
    ChatMessage(role="tool", content="21 degrees", tool_call_id="abc123XYZ", name="get_weather"),
]

# (file, format it is detected as, whether it reasons in <think> blocks)
FAMILIES = [
    ("Qwen-Qwen3-0.6B.jinja", "hermes", True),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3", False),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral", False),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseek_r1", True),
    ("google-gemma-2-2b-it.jinja", "generic", False),
]


def template(name: str, **kw: object) -> JinjaTemplate:
    return JinjaTemplate((TEMPLATES / name).read_text(encoding="utf-8"), "<s>", "</s>", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "fmt", "reasoning"), FAMILIES)
def test_format_is_detected_from_the_template(name: str, fmt: str, reasoning: bool) -> None:
    t = template(name)
    assert t.format == chat_formats.ChatFormat(tools=fmt, reasoning=reasoning)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "fmt", "reasoning"), FAMILIES)
def test_renders_tools_calls_and_results(name: str, fmt: str, reasoning: bool) -> None:
    text = template(name).render(HISTORY, tools=[WEATHER])
    # The tool is offered with its description as written (no HTML escaping by tojson).
    assert "get_weather" in text and "<in °C>" in text
    # The earlier call is written with its arguments as JSON, not as a quoted string.
    assert '"city": "Paris"' in text and '\\"city\\"' not in text.split("21 degrees")[0].split("Weather in Paris?")[-1]
    assert "21 degrees" in text


def test_options_override_detection() -> None:
    t = template("Qwen-Qwen3-0.6B.jinja", tool_format="generic", reasoning=False)
    assert t.format == chat_formats.ChatFormat(tools="generic", reasoning=False)
    text = t.render(HISTORY, tools=[WEATHER])
    # Generic: the template never sees the tools; the instructions are a system message.
    assert "<tools>" not in text and '{"tool_calls": [{"name": "get_weather"' in text


def test_call_arguments_fall_back_to_text_for_templates_that_concatenate_them() -> None:
    # DeepSeek-R1's template writes `+ arguments`, which needs a string: the renderer
    # retries with the text the client sent.
    t = template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", tool_format="hermes")
    text = t.render(HISTORY, tools=[WEATHER])
    assert '```json\n{"city": "Paris"}\n```' in text


def test_template_errors_are_template_errors() -> None:
    # Mistral's template refuses call ids that are not 9 characters: a 400, not a crash.
    bad = [HISTORY[1], ChatMessage(role="assistant", content="", tool_calls=[ToolCall(id="x", name="f", arguments="{}")])]
    with pytest.raises(TemplateError, match="9"):
        template("mistralai-Mistral-Nemo-Instruct-2407.jinja").render(bad, tools=[WEATHER])


def test_generic_rewrite_for_a_template_without_system_role() -> None:
    # gemma refuses a system message and insists that roles alternate: the instructions
    # go into the first user turn, and the tool result becomes a user turn.
    text = template("google-gemma-2-2b-it.jinja").render(HISTORY, tools=[WEATHER])
    assert text.startswith("<start_of_turn>user\nBe brief.\n\nYou can call these tools")
    assert '<start_of_turn>model\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}' in text
    assert '"tool_response": {"content": "21 degrees"' in text
    assert text.endswith("<start_of_turn>model\n")


def test_consecutive_tool_results_merge_into_one_user_turn() -> None:
    msgs = chat_formats.generic_messages(
        [
            ChatMessage(role="user", content="q"),
            ChatMessage(
                role="assistant",
                content="",
                tool_calls=[ToolCall(id="1", name="a", arguments="{}"), ToolCall(id="2", name="b", arguments="{}")],
            ),
            ChatMessage(role="tool", content="A", tool_call_id="1"),
            ChatMessage(role="tool", content="B", tool_call_id="2"),
        ],
        None,
        system_role=True,
    )
    assert [m.role for m in msgs] == ["user", "assistant", "user"]
    assert [json.loads(line)["tool_response"]["content"] for line in msgs[2].content.split("\n")] == ["A", "B"]


def test_a_builtin_template_takes_tools_in_the_generic_format_by_default() -> None:
    """Issue 20, item 3: the stock config's chat_template = "gemma" refused every request
    with tools (400) until the user found tool_format = "generic"; llama-server answers
    the same request with its generic format (common/chat.cpp,
    common_chat_params_init_generic, for any template without a format of its own)."""
    for fmt in ("auto", "generic"):
        t = BuiltinTemplate("gemma", fmt)
        assert t.format.tools == "generic"
        text = t.render(HISTORY, tools=[WEATHER])
        assert "You can call these tools" in text and "21 degrees" in text
    # Another format is refused by the config check, and cannot render here either.
    assert BuiltinTemplate("gemma", "hermes").format.tools is None
    with pytest.raises(TemplateError):
        BuiltinTemplate("gemma", "hermes").render(HISTORY)


@pytest.mark.parametrize("t", [template("Qwen-Qwen3-0.6B.jinja"), BuiltinTemplate("chatml")], ids=["jinja", "builtin"])
def test_final_assistant_message_is_continued(t: JinjaTemplate | BuiltinTemplate) -> None:
    msgs = [ChatMessage(role="user", content="Count to 3"), ChatMessage(role="assistant", content="1, 2")]
    text = t.render(msgs)
    assert text.endswith("<|im_start|>assistant\n1, 2")
    assert text == t.render(msgs[:1]) + "1, 2"


def test_prefill_counts_toward_the_byte_limit() -> None:
    from worker.chat_template import TemplateTooLong

    msgs = [ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="x" * 100)]
    with pytest.raises(TemplateTooLong) as info:
        BuiltinTemplate("chatml").render(msgs, max_bytes=90)
    assert info.value.n_bytes > 100


def test_template_kwargs_reach_the_template() -> None:
    t = template("Qwen-Qwen3-0.6B.jinja")
    msgs = [ChatMessage(role="user", content="hi")]
    assert t.render(msgs).endswith("<|im_start|>assistant\n")
    assert t.render(msgs, template_kwargs={"enable_thinking": False}).endswith("<think>\n\n</think>\n\n")


def test_open_reasoning_block_at_the_end_of_the_prompt() -> None:
    assert chat_formats.ends_in_reasoning("<|im_start|>assistant\n<think>\n", 64)
    assert not chat_formats.ends_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", 64)
    assert not chat_formats.ends_in_reasoning("<|im_start|>assistant\n", 64)
    # An opening tag in the history, far from the end, does not count.
    assert not chat_formats.ends_in_reasoning("user wrote <think>" + "x" * 200, 64)
    # A prefill that opens a block, counted in the tail.
    assert chat_formats.ends_in_reasoning("A:<think>\nlong thoughts " + "y" * 100, 64 + 120)


def test_detection_of_formats_by_markers() -> None:
    assert chat_formats.detect_tool_format("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert chat_formats.detect_tool_format("<tool_call>") == "hermes"
    assert chat_formats.detect_tool_format("<|start_header_id|>{{ '<|python_tag|>' }}") == "llama3"
    assert chat_formats.detect_tool_format("<start_of_turn>") == "generic"
    assert chat_formats.resolve("auto", None, True) == chat_formats.ChatFormat(tools="generic", reasoning=False)
    assert chat_formats.resolve("generic", None, True).tools == "generic"


def test_add_generation_prompt_false_leaves_the_assistants_turn_closed() -> None:
    """llama.cpp's test_template.py test_add_generation_prompt and test_chat_completion.py's
    continue_final_message: without the generation prompt the template does not open the
    assistant's turn, and a final assistant message is a whole turn, not continued."""
    source = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    t = JinjaTemplate(source, "", "")
    ask = [ChatMessage(role="user", content="q")]
    assert t.render(ask) == "<user>q</user><assistant>"
    assert t.render(ask, add_generation_prompt=False) == "<user>q</user>"
    prefill = [*ask, ChatMessage(role="assistant", content="Wh")]
    assert t.render(prefill) == "<user>q</user><assistant>Wh"  # continued
    assert t.render(prefill, add_generation_prompt=False) == "<user>q</user><assistant>Wh</assistant>"


def test_enable_thinking_is_true_unless_the_model_or_the_request_says_otherwise() -> None:
    """llama.cpp's test_template.py test_reasoning: llama-server's template context always
    has enable_thinking (true by default), so a template written `if not enable_thinking`
    opens its <think> block; --reasoning off (the model's chat_template_kwargs here) closes
    it, and a request's own chat_template_kwargs win over both."""
    source = (
        "{% for m in messages %}{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<A><think>\n{% if not enable_thinking %}</think>{% endif %}{% endif %}"
    )
    ask = [ChatMessage(role="user", content="q")]
    assert JinjaTemplate(source, "", "").render(ask).endswith("<think>\n")
    off = JinjaTemplate(source, "", "", defaults={"enable_thinking": False})
    assert off.render(ask).endswith("<think>\n</think>")
    assert off.render(ask, template_kwargs={"enable_thinking": True}).endswith("<think>\n")


def test_templates_get_todays_date_as_llama_server_gives_it() -> None:
    """llama.cpp's test_template.py test_date_inside_prompt: Llama 3.3's `date_string` and
    Firefunction's `datetime` are today's (common_chat_extra_context), and `strftime_now`."""
    import datetime

    source = "{{ date_string }}|{{ datetime }}|{{ strftime_now('%Y') }}|{{ functions }}"
    today = datetime.date.today()
    text = JinjaTemplate(source, "", "").render([ChatMessage(role="user", content="q")])
    # Firefunction's `functions` (the tools as JSON text) is "" without tools.
    assert text == f"{today.strftime('%d %b %Y')}|{today.strftime('%b %d %Y')}|{today.year}|"


def test_a_prompt_ends_in_reasoning_by_its_familys_own_tags() -> None:
    """Issue 22: Command R7B's generation prompt may open <|START_THINKING|>, Magistral's
    [THINK]; the worker tells the router so by the family's tags, not only <think>."""
    tags = ("<|START_THINKING|>", "<|END_THINKING|>")
    assert chat_formats.ends_in_reasoning("<|CHATBOT_TOKEN|><|START_THINKING|>", 64, tags)
    assert not chat_formats.ends_in_reasoning("<|START_THINKING|>x<|END_THINKING|>", 64, tags)
    assert not chat_formats.ends_in_reasoning("<|CHATBOT_TOKEN|><think>", 64, tags)
