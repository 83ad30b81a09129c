"""`corral chat --config` with the demo model, in a pseudo-terminal: the supervisor and the
real worker in the chat's own process, no HTTP. Two turns, Ctrl-C mid-reply, a turn after
it, /exit."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import chat_terminal as term
from tests.e2e.conftest import DEMO_MODEL

pytestmark = pytest.mark.model

# One slot: the turn after the Ctrl-C can only run if the cut reply gave it back. A
# base model given a chat template rambles, so a reply runs to max_tokens: 120 tokens,
# 2 s at the 60 tok/s of a quiet machine, 40 s on a busy 2-core one (measured: 2.8
# tok/s), while the Ctrl-C goes out as soon as the first character shows.
CONFIG = """
[models.gemma]
path = "{MODEL}"
aliases = ["g"]
chat_template = "gemma"
slots = 1
n_ctx = 4096
# As examples/config.toml: the worker writes its conversations out on its way down, and
# says so in an INFO line that must not reach the terminal (issue 41, item 5).
prompt_cache_dir = "cache"
"""
MAX_TOKENS = 120


def test_in_process_two_turns_ctrl_c_mid_reply_then_exit(tmp_path: Path) -> None:
    if not DEMO_MODEL.is_file():
        pytest.fail(f"demo model missing at {DEMO_MODEL}: run `make model` (make test does)")
    cfg = tmp_path / "chat.toml"
    cfg.write_text(CONFIG.replace("{MODEL}", str(DEMO_MODEL)))
    # No $CORRAL_URL from the environment may turn this into an HTTP chat.
    child = term.spawn(
        ["g", "--config", str(cfg), "--max-tokens", str(MAX_TOKENS), "--temperature", "0",
         "--system", "You answer in one sentence."],
        env={"CORRAL_URL": ""},
    )
    child.expect_exact("in this process")
    term.wait_for_prompt(child)
    first = term.say(child, "Hello! Who are you?")
    second = term.say(child, "What is a llama?")
    cut = term.say_and_interrupt(child, "Write a very long story about llamas.")
    after_cut = term.quiet_for(child, 2.0)
    later = term.say(child, "Thank you.")
    status = term.leave(child)

    for turn in (first, second, later):
        assert not turn.estimated and 0 < turn.tokens <= MAX_TOKENS, turn
        assert "interrupted" not in turn.rest, turn
        assert turn.text.strip(), turn  # the reply was shown
    assert "interrupted" in cut.rest and cut.estimated and cut.tokens < MAX_TOKENS, cut
    assert after_cut == "", f"the reply went on after Ctrl-C: {after_cut!r}"
    assert status == 0
