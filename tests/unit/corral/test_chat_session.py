"""`corral chat`'s pure side: commands, triple-quote blocks, the conversation, the request
body, and the figures line (corral/chat/session.py)."""

from __future__ import annotations

import pytest

from corral.chat.session import (
    Conversation,
    Exit,
    Help,
    LineReader,
    Problem,
    ReplyOptions,
    ReplyTimes,
    Reset,
    Say,
    SetSystem,
    parse_command,
    printable,
    request_body,
    stats_line,
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("hello", Say("hello")),
        ("  indented, kept as typed", Say("  indented, kept as typed")),
        ("/reset", Reset()),
        ("  /exit  ", Exit()),
        ("/quit", Exit()),
        ("/help", Help()),
        ("/system You are terse.", SetSystem("You are terse.")),
        ("/system    spaced   ", SetSystem("spaced")),
        ("/system", SetSystem("")),
    ],
)
def test_commands(line: str, expected: object) -> None:
    assert parse_command(line) == expected


def test_an_unknown_command_is_a_problem_that_says_how_to_send_a_slash() -> None:
    got = parse_command("/exti")
    assert isinstance(got, Problem)
    assert "/exti" in got.message and "/help" in got.message and '"""' in got.message


def test_a_command_that_takes_nothing_refuses_an_argument() -> None:
    # "/reset everything" must not silently reset (nor be sent to the model).
    got = parse_command("/reset everything")
    assert isinstance(got, Problem) and "takes no argument" in got.message


def test_a_block_is_one_message_with_its_newlines_and_never_a_command() -> None:
    r = LineReader()
    assert r.feed('"""') is None and r.in_block
    assert r.feed("/reset is not a command in here") is None
    assert r.feed("") is None  # blank lines are kept inside a block
    assert r.feed('last line"""') == Say("/reset is not a command in here\n\nlast line")
    assert not r.in_block


def test_a_block_may_start_on_its_opening_line_and_close_on_its_own() -> None:
    r = LineReader()
    assert r.feed('"""first') is None
    assert r.feed('"""') == Say("first\n")
    assert r.feed('"""one line"""') == Say("one line")


def test_empty_input_sends_nothing() -> None:
    r = LineReader()
    assert r.feed("") is None and r.feed("   ") is None
    assert r.feed('""""""') is None
    assert r.feed('"""') is None and r.feed('  """') is None and not r.in_block


def test_dropping_a_block_forgets_it() -> None:
    r = LineReader()
    r.feed('"""half')
    r.drop()
    assert not r.in_block and r.feed("next") == Say("next")


def test_the_conversation_puts_the_system_message_first_and_keeps_turns_until_reset() -> None:
    c = Conversation(system="Be brief.")
    c.add("hi", "hello")
    assert c.messages("again") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    c.system = ""
    assert c.messages("x")[0] == {"role": "user", "content": "hi"}
    c.reset()
    assert c.messages("x") == [{"role": "user", "content": "x"}]


def test_the_body_streams_with_usage_and_leaves_unset_options_to_the_server() -> None:
    msgs = [{"role": "user", "content": "x"}]
    plain = request_body("m", msgs, ReplyOptions())
    assert plain == {"model": "m", "messages": msgs, "stream": True, "stream_options": {"include_usage": True}}
    tuned = request_body("m", msgs, ReplyOptions(max_tokens=7, temperature=0.0))
    assert tuned["max_tokens"] == 7 and tuned["temperature"] == 0.0


def test_the_rate_is_tokens_after_the_first_over_the_time_after_the_first() -> None:
    times = ReplyTimes(asked=10.0, first=10.5, last=12.5)
    assert stats_line(times, 41, pieces=30, interrupted=False) == (
        "41 tokens, 20.0 tok/s, first token after 0.50 s"
    )


def test_without_the_servers_count_the_pieces_stand_in_and_say_so() -> None:
    times = ReplyTimes(asked=0.0, first=1.0, last=2.0)
    assert stats_line(times, None, pieces=11, interrupted=True) == (
        "~11 tokens, ~10.0 tok/s, first token after 1.00 s, interrupted"
    )


def test_a_reply_with_nothing_in_it_has_no_rate() -> None:
    assert stats_line(ReplyTimes(0.0, None, None), None, 0, interrupted=True) == "~0 tokens, interrupted"
    assert stats_line(ReplyTimes(0.0, 0.25, 0.25), 1, 1, interrupted=False) == (
        "1 token, first token after 0.25 s"
    )


def test_what_a_reply_writes_to_the_terminal_cannot_drive_it() -> None:
    hostile = "ok\x1b]52;c;ZXZpbA==\x07 \x1b[2J\x9b31m\r\x08line\n\ttab"
    shown = printable(hostile)
    assert shown == "ok]52;c;ZXZpbA== [2J31mline\n\ttab"
    assert printable("héllo 🦙 “quotes”") == "héllo 🦙 “quotes”"
