"""`corral chat`'s state and input, as plain data: what each line typed means, the
conversation kept between replies, the request body a reply is asked with, and the
figures shown after it. No I/O here: corral/chat/terminal.py owns the terminal, and the
backends (corral/chat/over_http.py, corral/chat/in_process.py) turn a body into a reply.

Input, one line at a time:
  - a line is a message, unless it starts with `/` (a command: /help lists them);
  - a line starting with `\"\"\"` opens a block that the first line ending in `\"\"\"`
    closes, as in llama-cli and ollama: everything between is one message, newlines
    kept, and a block is never a command (the way to send a message that starts with `/`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

QUOTES = '"""'

HELP = f"""\
  /reset          forget the conversation (the system message stays)
  /system TEXT    set the system message; /system alone clears it
  /exit           leave (so do /quit and Ctrl-D on an empty line)
  /help           this list
  {QUOTES}            start a message of several lines; a line ending in {QUOTES} ends it
  Ctrl-C          stop a reply; at the prompt, drop what was typed"""


class ChatError(Exception):
    """Something a reply, or the chat, cannot go on with, in words for the terminal."""


# Added to a "prompt too long" error: the conversation only grows, so every later message
# would fail the same way until it is forgotten.
TOO_LONG_HINT = " (/reset forgets the conversation)"


@dataclass(frozen=True)
class Say:
    """A message to send."""

    text: str


@dataclass(frozen=True)
class Reset:
    pass


@dataclass(frozen=True)
class SetSystem:
    text: str  # "": no system message


@dataclass(frozen=True)
class Exit:
    pass


@dataclass(frozen=True)
class Help:
    pass


@dataclass(frozen=True)
class Problem:
    """A line that means nothing; `message` says why and what would."""

    message: str


Command = Union[Say, Reset, SetSystem, Exit, Help, Problem]

_COMMANDS: dict[str, Command] = {"/reset": Reset(), "/exit": Exit(), "/quit": Exit(), "/help": Help(), "/?": Help()}


def parse_command(line: str) -> Command:
    """What one complete line means (a block's text is never parsed here)."""
    stripped = line.strip()
    if not stripped.startswith("/"):
        return Say(line)
    word, _, rest = stripped.partition(" ")
    if word == "/system":
        return SetSystem(rest.strip())
    known = _COMMANDS.get(word)
    if known is None:
        return Problem(
            f"unknown command {word}; /help lists the commands "
            f"(to send a message that starts with /, put it in a {QUOTES} block)"
        )
    if rest.strip():
        return Problem(f"{word} takes no argument")
    return known


@dataclass
class LineReader:
    """Turns typed lines into commands, holding a triple-quoted block until it is closed."""

    _block: list[str] | None = None

    @property
    def in_block(self) -> bool:
        """True while a block is open: the prompt should say that more is expected."""
        return self._block is not None

    def drop(self) -> None:
        """Forget an open block (Ctrl-C at the prompt)."""
        self._block = None

    def feed(self, line: str) -> Command | None:
        """The command `line` completes, or None: a blank line, or a block still open."""
        if self._block is not None:
            end = line.rstrip()
            if end.endswith(QUOTES):
                self._block.append(end[: -len(QUOTES)])
                text, self._block = "\n".join(self._block), None
                return Say(text) if text.strip() else None
            self._block.append(line)
            return None
        opening = line.lstrip()
        if opening.startswith(QUOTES):
            rest = opening[len(QUOTES) :]
            # `"""one line"""` opens and closes at once; a bare `"""` only opens.
            if len(rest.rstrip()) >= len(QUOTES) and rest.rstrip().endswith(QUOTES):
                text = rest.rstrip()[: -len(QUOTES)]
                return Say(text) if text.strip() else None
            self._block = [rest] if rest.strip() else []
            return None
        if not line.strip():
            return None
        return parse_command(line)


@dataclass
class Conversation:
    """The messages so far, and the system message that goes first."""

    system: str = ""
    turns: list[dict[str, str]] = field(default_factory=list)

    def messages(self, user: str) -> list[dict[str, str]]:
        """The messages of a request that says `user` next."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, *self.turns, {"role": "user", "content": user}]

    def add(self, user: str, reply: str) -> None:
        """Keep a finished exchange. A reply cut by Ctrl-C is kept as far as it went:
        that is what was shown, and what the next message answers."""
        self.turns += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]

    def reset(self) -> None:
        self.turns = []


@dataclass(frozen=True)
class ReplyOptions:
    """The command line's sampling options; None leaves the server's (or the model's
    configured) default."""

    max_tokens: int | None = None
    temperature: float | None = None


def request_body(model: str, messages: list[dict[str, str]], options: ReplyOptions) -> dict[str, Any]:
    """The /v1/chat/completions body of a reply: the same over HTTP and in-process, so
    both go through the same decoding and validation."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        # The usage chunk counts the reply's tokens for the tokens-per-second line.
        "stream_options": {"include_usage": True},
    }
    if options.max_tokens is not None:
        body["max_tokens"] = options.max_tokens
    if options.temperature is not None:
        body["temperature"] = options.temperature
    return body


@dataclass(frozen=True)
class Piece:
    """Text of the reply as it arrives; `reasoning` for a thinking model's
    reasoning_content, which is shown but not kept in the conversation."""

    text: str
    reasoning: bool = False


@dataclass(frozen=True)
class Finished:
    """The end of a reply: why it ended, and how many tokens it had (None: not told)."""

    finish_reason: str
    tokens: int | None = None


Event = Union[Piece, Finished]


# C0 controls but newline and tab, DEL, and the C1 controls: what could move the cursor,
# rewrite the screen, retitle the window or write the clipboard (OSC 52) if a model or a
# server put it in a reply.
_CONTROLS = {c: None for c in [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)] if chr(c) not in "\n\t"}


def printable(text: str) -> str:
    """`text` safe to write to a terminal: control characters removed, escape sequences
    left as the harmless text that follows their ESC."""
    return text.translate(_CONTROLS)


@dataclass(frozen=True)
class ReplyTimes:
    """Monotonic times of one reply: asked, first piece, last piece."""

    asked: float
    first: float | None
    last: float | None


def stats_line(times: ReplyTimes, tokens: int | None, pieces: int, interrupted: bool) -> str:
    """The line shown after a reply. The rate is the decode rate: tokens after the first
    over the time after the first, since the first token's time is the prompt's (shown
    apart as the time to first token). Without the server's count (a reply cut short
    over HTTP) the pieces received stand in, each about one token, and the line says so."""
    counted = tokens if tokens is not None else pieces
    about = "" if tokens is not None else "~"
    parts = [f"{about}{counted} token{'s' if counted != 1 else ''}"]
    if times.first is not None and times.last is not None and counted > 1 and times.last > times.first:
        parts.append(f"{about}{(counted - 1) / (times.last - times.first):.1f} tok/s")
    if times.first is not None:
        parts.append(f"first token after {times.first - times.asked:.2f} s")
    if interrupted:
        parts.append("interrupted")
    return ", ".join(parts)
