"""Driving `corral chat` in a pseudo-terminal (pexpect), as a person would: shared by the
test over HTTP (fake workers) and the one in-process (the demo model)."""

from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pexpect

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "> "
# Every figures line: "[N tokens, R tok/s, first token after S s...]" (a cut reply's N
# and R start with "~").
STATS = re.compile(r"\[(~?)(\d+) tokens?(?:, ~?[\d.]+ tok/s)?, first token after [\d.]+ s([^\]]*)\]")
# A slow CI machine loads the model and decodes slowly; every wait is generous.
PATIENCE = 180


def spawn(args: list[str], env: dict[str, str] | None = None) -> pexpect.spawn:
    """`corral chat ARGS` in a pty. TERM=dumb keeps readline from writing the escape
    codes of bracketed paste around each line."""
    full_env = {**os.environ, "TERM": "dumb", **(env or {})}
    return pexpect.spawn(
        sys.executable, ["-m", "corral", "chat", *args],
        cwd=str(ROOT), env=full_env, encoding="utf-8", timeout=PATIENCE, dimensions=(40, 200),
        # Started with SIGINT ignored, as under a shell without job control (a CI run put
        # in the background was): Ctrl-C must stop a reply all the same.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


@dataclass
class Turn:
    tokens: int
    estimated: bool  # "~": counted from the pieces, the server's count never came
    rest: str  # what follows the time to first token: ", interrupted", ", cut at..."
    text: str  # everything the terminal showed between the line typed and the figures


@dataclass
class Transcript:
    turns: list[Turn] = field(default_factory=list)


def wait_for_prompt(child: pexpect.spawn) -> None:
    child.expect_exact(PROMPT)


def say(child: pexpect.spawn, line: str) -> Turn:
    """Type a line, wait for the reply's figures and the next prompt."""
    child.sendline(line)
    child.expect_exact(line)  # the terminal's echo
    child.expect(STATS)
    turn = _turn(child)
    wait_for_prompt(child)
    return turn


def say_and_interrupt(child: pexpect.spawn, line: str) -> Turn:
    """Type a line, press Ctrl-C as soon as the reply has started to show, and wait for
    the figures of the cut reply and the next prompt."""
    child.sendline(line)
    child.expect_exact(line)
    child.expect(r"\r?\n")
    child.expect(r"[^\s\[]")  # the reply's first visible character
    child.sendintr()
    child.expect(STATS)
    turn = _turn(child)
    wait_for_prompt(child)
    return turn


def quiet_for(child: pexpect.spawn, seconds: float) -> str:
    """What the terminal shows in the next `seconds` while nothing is typed."""
    try:
        child.expect(r"\S", timeout=seconds)
    except pexpect.TIMEOUT:
        return ""
    return str(child.after) + child.read_nonblocking(4096, timeout=0.5)


def _turn(child: pexpect.spawn) -> Turn:
    m = child.match
    assert m is not None
    return Turn(tokens=int(m.group(2)), estimated=m.group(1) == "~", rest=m.group(3), text=str(child.before))


def leave(child: pexpect.spawn) -> int:
    """/exit, then the exit status. Nothing may be printed after the /exit (issue 41, item
    5: a worker's INFO line on its way out landed under the last prompt)."""
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    after = str(child.before).replace("/exit", "", 1).strip()
    assert after == "", f"printed after /exit: {after!r}"
    child.close()
    assert child.exitstatus is not None, f"killed by signal {child.signalstatus}"
    return int(child.exitstatus)
