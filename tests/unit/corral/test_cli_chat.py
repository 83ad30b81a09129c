"""`corral chat`'s terminal loop (corral/chat/terminal.py) over a scripted backend: what is
kept of a reply, what Ctrl-C does at the prompt and mid-reply, and the figures line."""

from __future__ import annotations

import io
from typing import Any, Generator

import pytest

from corral.chat.session import ChatError, Conversation, Event, Finished, Piece, ReplyOptions
from corral.chat.terminal import Terminal, api_key


class Script:
    """A backend whose replies are scripted: each a list of events, where an exception
    instance is raised at that point (KeyboardInterrupt stands for Ctrl-C)."""

    def __init__(self, *replies: list[Any]) -> None:
        self.replies = list(replies)
        self.bodies: list[dict[str, Any]] = []
        self.closed = 0  # replies whose generator was closed before its end

    def reply(self, body: dict[str, Any]) -> Generator[Event, None, None]:
        self.bodies.append(body)
        script = self.replies.pop(0)
        ended = False
        try:
            for item in script:
                if isinstance(item, BaseException):
                    raise item
                yield item
            ended = True
        finally:
            if not ended:
                self.closed += 1


def _terminal(backend: Script, system: str = "") -> tuple[Terminal, io.StringIO]:
    out = io.StringIO()
    return Terminal(backend, "m", ReplyOptions(max_tokens=9), Conversation(system=system), out=out), out


def test_a_whole_reply_is_shown_kept_and_counted() -> None:
    backend = Script([Piece("Hel"), Piece("lo"), Finished("stop", 2)])
    t, out = _terminal(backend, system="S")
    t.say("hi")
    assert out.getvalue().startswith("Hello\n[2 tokens")
    assert t.conversation.turns == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}]
    assert backend.bodies[0]["messages"][0] == {"role": "system", "content": "S"}
    assert backend.bodies[0]["max_tokens"] == 9 and backend.bodies[0]["stream"] is True


def test_ctrl_c_mid_reply_stops_it_keeps_what_was_shown_and_closes_the_stream() -> None:
    backend = Script([Piece("part"), KeyboardInterrupt(), Piece("never")])
    t, out = _terminal(backend)
    t.say("hi")
    shown = out.getvalue()
    assert "part" in shown and "never" not in shown and "interrupted]" in shown and "~1 token" in shown
    assert backend.closed == 1
    assert t.conversation.turns[-1] == {"role": "assistant", "content": "part"}


def test_ctrl_c_before_any_text_drops_the_exchange() -> None:
    # Two user messages in a row are refused by templates that insist on alternation.
    t, out = _terminal(Script([KeyboardInterrupt()]))
    t.say("hi")
    assert t.conversation.turns == [] and "interrupted]" in out.getvalue()


def test_an_error_is_one_line_and_the_exchange_is_dropped() -> None:
    t, out = _terminal(Script([Piece("x"), ChatError("the worker crashed\x1b[2J")]))
    t.say("hi")
    assert "error: the worker crashed[2J" in out.getvalue() and "\x1b[2J" not in out.getvalue()
    assert t.conversation.turns == []


def test_reasoning_is_shown_but_not_kept() -> None:
    t, out = _terminal(Script([Piece("think", reasoning=True), Piece("answer"), Finished("length", 5)]))
    t.say("hi")
    assert "think" in out.getvalue() and "cut at the token limit" in out.getvalue()
    assert t.conversation.turns[-1]["content"] == "answer"


def test_the_loop_survives_ctrl_c_at_the_prompt_and_runs_commands_until_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[Any] = ["first", KeyboardInterrupt(), '"""', "two", 'lines"""', "/system Be short.", "/bogus",
                        "/reset", "after reset", "/exit", "never read"]
    prompts: list[str] = []

    def fake_input(prompt: str) -> str:
        prompts.append(prompt)
        item = lines.pop(0)
        if isinstance(item, BaseException):
            raise item
        return str(item)

    monkeypatch.setattr("builtins.input", fake_input)
    backend = Script(*[[Piece(f"r{i}"), Finished("stop", 1)] for i in range(3)])
    t, out = _terminal(backend)
    assert t.loop() == 0
    assert lines == ["never read"]
    assert prompts.count("... ") == 2  # inside the block
    shown = out.getvalue()
    assert "/exit or Ctrl-D leaves" in shown and "unknown command /bogus" in shown
    assert [b["messages"][-1]["content"] for b in backend.bodies] == ["first", "two\nlines", "after reset"]
    # /reset forgot both exchanges; the system message set before it stays.
    assert backend.bodies[2]["messages"] == [
        {"role": "system", "content": "Be short."},
        {"role": "user", "content": "after reset"},
    ]


def test_end_of_input_leaves_with_status_0(monkeypatch: pytest.MonkeyPatch) -> None:
    def eof(prompt: str) -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", eof)
    t, _ = _terminal(Script())
    assert t.loop() == 0


def test_the_key_file_gives_its_first_real_line_and_an_empty_one_is_refused(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_API_KEY", "from-env")
    assert api_key(None) == "from-env"
    f = tmp_path / "k"
    f.write_text("# comment\n\n  the-key  \nsecond\n")
    assert api_key(str(f)) == "the-key"
    f.write_text("# only a comment\n")
    with pytest.raises(ChatError, match="holds no key"):
        api_key(str(f))
    monkeypatch.delenv("CORRAL_API_KEY")
    assert api_key(None) is None
